"""Starting the I/O process from any working directory."""

from __future__ import annotations

import os

from tsfront import ClientConfig, IOProcess


def test_io_process_ignores_a_tsfront_checkout_in_the_working_directory(tmp_path, monkeypatch):
    # The README's first command installs (not editable) and runs from the checkout, whose
    # tsfront/ has no compiled extension; the child must import the installed package.
    decoy = tmp_path / "tsfront"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the checkout, not the install')\n")
    monkeypatch.chdir(tmp_path)
    io = IOProcess.start(ClientConfig(handshake_address="tcp://127.0.0.1:0"))
    try:
        assert io.alive()
        assert io.address.startswith("unix:@")
    finally:
        io.stop()
    assert not io.alive()
    assert os.getcwd() == str(tmp_path)


# SIGTERM as soon as the I/O process reported its addresses, a few times: it lands while the
# process settles its heap or enters its loop (the window where a stop was a `_Terminate`
# traceback, in 2 runs of 3 of the README's embedded example stopped with SIGTERM).
_STOP_AT_ONCE = """
import os, signal
from tsfront import ClientConfig, IOProcess

for _ in range(ROUNDS):
    io = IOProcess.start(ClientConfig(handshake_address="tcp://127.0.0.1:0"))
    os.kill(io.pid, signal.SIGTERM)
    io.stop()
"""


def test_a_sigterm_while_the_io_process_starts_is_no_traceback() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _STOP_AT_ONCE.replace("ROUNDS", "8")],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TSFRONT_LOG"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
