"""gunicorn settings for ``app.py``: one tsfront I/O process for all the uvicorn workers.

    TSFRONT_HANDSHAKE=tcp://127.0.0.1:30500 TSFRONT_NUM_ENGINES=2 TSFRONT_MODEL=path/to/model \\
        gunicorn -c examples/fastapi/gunicorn.conf.py --chdir examples/fastapi -w 4 \\
        -b 127.0.0.1:8000 app:app

``on_starting`` runs once in the master before any worker is forked: it starts the I/O
process (which binds the handshake the engines dial; its address is printed as
``handshake: ADDR``) and puts its attach address in ``TSFRONT_ATTACH``, which every worker
inherits and attaches to in the app's lifespan. ``on_exit`` stops it. The I/O process also
dies with the master (PR_SET_PDEATHSIG), so a killed master leaves nothing behind.
"""

import os
import sys

from tsfront import ClientConfig, IOProcess

worker_class = "uvicorn_worker.UvicornWorker"
# Workers attach (and wait for every engine) in their lifespan: give them the handshake time.
timeout = int(os.environ.get("TSFRONT_HANDSHAKE_TIMEOUT", "600")) + 30
graceful_timeout = 5

_io = None


def on_starting(server):
    global _io
    workers = server.cfg.workers
    _io = IOProcess.start(
        ClientConfig(
            handshake_address=os.environ.get("TSFRONT_HANDSHAKE", "tcp://127.0.0.1:30500"),
            num_engines=int(os.environ.get("TSFRONT_NUM_ENGINES", "1")),
            handshake_timeout=float(os.environ.get("TSFRONT_HANDSHAKE_TIMEOUT", "600")),
            # A replaced worker attaches before its predecessor's place is freed.
            max_workers=2 * workers,
        )
    )
    os.environ["TSFRONT_ATTACH"] = _io.address
    sys.stdout.write(f"handshake: {_io.handshake_address}\n")
    sys.stdout.flush()


def on_exit(server):
    if _io is not None:
        _io.stop()
