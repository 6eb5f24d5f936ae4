"""``tsfront.testing``: rigs for users' test and throughput suites, and their pytest plugin.

* :mod:`~tsfront.testing.engines` — `engine_rig`: an I/O process, simulated ranks and an
  attached `EngineClient`, started and stopped as one;
* :mod:`~tsfront.testing.replay` — `ReplayEngines`: an I/O process and engines that push
  pre-encoded frames on cue (a consumer measured per token measures only itself);
* :mod:`~tsfront.testing.serve` — `start_served` / `ServeProcess`: ``tsfront serve`` in a
  session of its own, with simulated ranks;
* :mod:`~tsfront.testing.plugin` — the pytest plugin (entry point ``pytest11``, installed
  with ``pip install '.[testing]'`` in tsfront's checkout): the above as fixtures. See
  docs/TESTING.md.

Importing this package does not import pytest (only the plugin module does), and
``import tsfront`` never imports this package.
"""

from tsfront.testing.engines import DEADLINE, EngineRig, engine_rig, private_addresses
from tsfront.testing.replay import ReplayEngines, ReplayRound
from tsfront.testing.serve import Served, ServeProcess, session_pids, start_served

__all__ = [
    "DEADLINE",
    "EngineRig",
    "ReplayEngines",
    "ReplayRound",
    "ServeProcess",
    "Served",
    "engine_rig",
    "private_addresses",
    "session_pids",
    "start_served",
]
