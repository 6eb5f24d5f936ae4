"""How a request is planned and run, whatever API dialect it came in.

`tsfront.serve.core.service` turns a request into a plan (prompts, sampling, grammar, parsers)
and runs it on the worker's `EngineClient`. Its parts: `reply` (what it answers: `Reply`,
`SSEReply`, `ApiError`), `shape` (what it asks of a dialect's response shape, `Format`),
`schema` (the chat and completions request bodies: the form every dialect's request takes to
the core), `choice` (one engine request of a response), `push` (the streamed hot path),
`parsing`, `tooling`, `structured`, `templates`, `chatsettings`, `limits`, `offload` and
`record`. The core imports no dialect (tests/unit/test_layout_imports.py).
"""
