"""``tsfront.serve``: the HTTP server on tsfront: one core under several API dialects.

* :mod:`~tsfront.serve.edge` — the HTTP edge: the connection's protocol and request cycle, the
  transport, keys and CORS (the gate), the edge's flags, the raw ASGI app that routes
  (`ServeApp`) and the ``/metrics`` page;
* :mod:`~tsfront.serve.core` — how a request is planned and run, whatever its dialect: the
  `Service`, what it answers (`Reply`, `SSEReply`, `ApiError`), the response shape it writes
  to (`Format`), one engine request of a response (`Choice`), the streamed hot path
  (`Pusher`), the chat output's parsing, tools, grammars, templates, limits, offload;
* the dialects, each the shapes of one API over the core: :mod:`~tsfront.serve.openai` (chat
  completions and completions: `OpenAIService`), :mod:`~tsfront.serve.responses`
  (``/v1/responses``), :mod:`~tsfront.serve.tokenize` (vLLM's ``/tokenize`` and
  ``/detokenize``);
* :mod:`~tsfront.serve.processes` — the server's processes: the worker, the responses store,
  the master's supervision policy, its shared counters and its listening sockets.

The master itself, ``tsfront serve``, is the command `tsfront.commands.serve`.
"""
