"""The Anthropic dialect: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``
(`messages`: the request mapped onto the core's chat request, the routes, Anthropic's error
shape) and the message's content blocks, whole and streamed (`blocks`), over
`tsfront.serve.core`.
"""
