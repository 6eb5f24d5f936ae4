"""The HTTP stacks ``tsfront serve`` was chosen against, for ``tsfront bench serve --stacks``.

``python -m tsfront.bench.stacks --stack granian|aiohttp --model DIR --handshake ADDR
--num-engines N --port P`` starts an I/O process, prints ``handshake: ADDR``, serves the same
`OpenAIService` with one worker on that stack, prints ``listening: URL`` and runs until
SIGTERM. Only the HTTP layer differs from ``tsfront serve --workers 1``:

* ``granian`` — granian's Rust HTTP server (one worker process, ASGI interface) running the
  same raw ASGI app (`ServeApp`, attached in its lifespan);
* ``aiohttp`` — aiohttp's server in this process, a handler that writes the same SSE events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
import urllib.request
from typing import cast

from tsfront.config import ClientConfig
from tsfront.process.ioproc import IOProcess

__all__ = ["main"]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _aiohttp(args: argparse.Namespace, address: str) -> None:
    from aiohttp import web

    from tsfront.client.engine_client import EngineClient
    from tsfront.serve.core.reply import Reply, SSEReply
    from tsfront.serve.openai.completions import OpenAIService
    from tsfront.text import TextModel

    text = TextModel.load(args.model)
    client = await EngineClient.attach(address)
    service = OpenAIService(client, text, text.name)

    def plain(reply: Reply) -> web.Response:
        headers = {k.decode(): v.decode() for k, v in reply.headers}
        return web.Response(status=reply.status, body=reply.body, headers=headers)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        handler = service.chat if request.path.endswith("chat/completions") else service.completions
        reply = await handler(body)
        if type(reply) is not SSEReply:
            return plain(cast(Reply, reply))
        response = web.StreamResponse(
            status=200, headers={k.decode(): v.decode() for k, v in reply.headers}
        )
        await response.prepare(request)
        try:
            async for event in reply.events:
                await response.write(event)
        finally:
            await reply.events.aclose()
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return plain(service.models())

    async def health(request: web.Request) -> web.Response:
        return plain(service.health())

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    _say(f"listening: http://{args.host}:{port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()
    await runner.cleanup()
    await client.close()


def _granian(args: argparse.Namespace, address: str) -> None:
    from granian import Granian
    from granian.constants import Interfaces

    port = args.port or _free_port()
    os.environ.update(TSFRONT_ATTACH=address, TSFRONT_MODEL=args.model)

    def announce() -> None:
        url = f"http://{args.host}:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        _say(f"listening: {url}")
                        return
            except OSError:
                time.sleep(0.1)

    threading.Thread(target=announce, daemon=True).start()
    Granian(
        "tsfront.serve.edge.asgi:app_from_env",
        factory=True,
        address=args.host,
        port=port,
        interface=Interfaces.ASGI,
        workers=1,
        log_enabled=False,
    ).serve()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry."""
    p = argparse.ArgumentParser(prog="python -m tsfront.bench.stacks")
    p.add_argument("--stack", choices=["granian", "aiohttp"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--handshake", required=True)
    p.add_argument("--num-engines", type=int, default=1)
    p.add_argument("--handshake-timeout", type=float, default=60.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    io = IOProcess.start(
        ClientConfig(
            handshake_address=args.handshake,
            num_engines=args.num_engines,
            handshake_timeout=args.handshake_timeout,
            max_workers=4,
        )
    )
    _say(f"handshake: {io.handshake_address}")
    try:
        if args.stack == "aiohttp":
            import uvloop

            uvloop.run(_aiohttp(args, io.address))
        else:
            _granian(args, io.address)
    finally:
        io.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
