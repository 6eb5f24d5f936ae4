"""A FastAPI app on tsfront: the OpenAI routes of `tsfront serve` plus a route of your own.

Every worker process attaches to ONE I/O process (which owns the engine sockets) in the
app's lifespan; where that I/O process comes from depends on how the app is run:

* gunicorn with uvicorn workers — ``gunicorn.conf.py`` starts it once in the master's
  ``on_starting`` hook and hands its address to the workers (``TSFRONT_ATTACH``);
* ``uvicorn --workers N`` — run ``tsfront io`` first and pass the address it prints in
  ``TSFRONT_ATTACH``.

Environment: ``TSFRONT_ATTACH`` (the I/O process's address), ``TSFRONT_MODEL`` (the model
folder: tokenizer.json, tokenizer_config.json, config.json).

The OpenAI routes reuse `tsfront.serve.openai.completions.OpenAIService`, so streaming, stop
strings, ``n``, logprobs and the error objects behave exactly as in ``tsfront serve``; FastAPI only
carries the bytes. ``POST /v1/tokens`` shows the lower level: tokenize, `generate`, read the
stream, detokenize.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tsfront import EngineClient, Error, InvalidRequest
from tsfront.serve.core.reply import SSEReply
from tsfront.serve.openai.completions import OpenAIService
from tsfront.text import TextModel
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput


@asynccontextmanager
async def lifespan(app: FastAPI):
    # One attach per worker process: it returns once every engine has registered.
    text = TextModel.load(os.environ["TSFRONT_MODEL"])
    client = await EngineClient.attach(os.environ["TSFRONT_ATTACH"])
    app.state.client = client
    app.state.text = text
    app.state.openai = OpenAIService(client, text, text.name, worker=os.getpid())
    try:
        yield
    finally:
        await client.close()  # open streams end; the I/O process keeps serving the others


app = FastAPI(lifespan=lifespan)


def _respond(reply) -> Response:
    headers = {k.decode(): v.decode() for k, v in reply.headers}
    if isinstance(reply, SSEReply):
        # Starlette closes the iterator if the client goes away, which aborts the request.
        return StreamingResponse(reply.events, headers=headers)
    return Response(reply.body, status_code=reply.status, headers=headers)


@app.post("/v1/completions")
async def completions(request: Request) -> Response:
    return _respond(await request.app.state.openai.completions(await request.body()))


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    return _respond(await request.app.state.openai.chat(await request.body()))


@app.get("/v1/models")
async def models(request: Request) -> Response:
    return _respond(request.app.state.openai.models())


@app.get("/health")
async def health(request: Request) -> Response:
    return _respond(request.app.state.openai.health())


@app.post("/v1/tokens")
async def tokens(request: Request) -> JSONResponse:
    """``{"text": ..., "max_tokens": N}`` → the generated token ids and their text."""
    body = await request.json()
    state = request.app.state
    ids = state.text.encode(str(body.get("text", "")))
    req = TokenizedGenerateReqInput(
        rid=f"tokens-{os.getpid()}-{id(body)}",
        input_ids=ids,
        stream=True,
        sampling_params=SamplingParams(max_new_tokens=int(body.get("max_tokens", 16))),
    )
    try:
        stream = await state.client.generate(req)
    except InvalidRequest as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    except Error as exc:  # Busy, EngineUnavailable
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "1"})
    out: list[int] = []
    finish = None
    async for chunk in stream:  # leaving early (or a cancelled handler) aborts the request
        out.extend(chunk.output_ids)
        finish = chunk.finish_reason
    return JSONResponse({"token_ids": out, "text": state.text.decode(out), "finish_reason": finish})
