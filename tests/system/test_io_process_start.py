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
