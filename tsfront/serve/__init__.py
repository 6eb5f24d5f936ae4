"""``tsfront.serve``: an OpenAI-compatible HTTP server on tsfront.

* :mod:`~tsfront.serve.api` — the endpoints' logic (`OpenAIService`), independent of HTTP;
* :mod:`~tsfront.serve.formats` — the response shapes, streamed events pre-encoded;
* :mod:`~tsfront.serve.schema` — the request bodies (msgspec structs);
* :mod:`~tsfront.serve.asgi` — the raw ASGI app (`ServeApp`) that carries them;
* :mod:`~tsfront.serve.worker` — one worker process (uvicorn + httptools on the socket it is given);
* :mod:`~tsfront.serve.ports` — the master's listening sockets, one per worker place;
* :mod:`~tsfront.serve.supervisor` — the master's rules for workers that die or go silent.

The master itself, ``tsfront serve``, is the command `tsfront.commands.serve`.
"""
