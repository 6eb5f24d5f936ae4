"""Transitional: `IOProcess` moved to `tsfront.ioproc`, the SIGINT helpers to `tsfront.sigint`.

Nothing in the I/O process imports this module. It stays only for the callers outside this
step's area (tsfront/serve/cli.py, tsfront/iocmd.py, tsfront/demo.py, tsfront/bench/); the
step that moves the commands imports the new homes and deletes it.
"""

from tsfront.ioproc import IOProcess
from tsfront.sigint import SigintHold, hold_sigint, ignore_sigint

__all__ = ["IOProcess", "SigintHold", "hold_sigint", "ignore_sigint"]
