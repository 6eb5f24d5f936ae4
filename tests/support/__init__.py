"""The shared rigs of tsfront's own tests, imported as ``support.<module>``.

* `core_fixtures` — the I/O process rig (`rig`, tsfront.testing's `engine_rig`), requests,
  waits with deadlines, spawned worker bodies;
* `raw_engine` — `RawEngine`, a rank driven by hand (the simulator's handshake, then any
  frame), and `raw_rig`;
* `serve_fixtures` — ``tsfront serve`` as a process group (tsfront.testing's `ServeProcess`);
* `text_fixtures` — mixed-script text and test model folders;
* `notify_reader` — a worker's side of the notify protocol, run as its own process;
* `hardening` — rank processes (`RankProcess`), the I/O rig of the hardening suite (`io_rig`),
  slot dumps and leak checks (`fd_count`, `region_inodes`, `region_mappers`).

``tests/`` is on ``sys.path`` through ``tests/conftest.py`` (pytest's rootdir-relative
import mode), so ``from support.core_fixtures import rig`` works from every test file in
every folder (``unit/``, ``system/``, ``hardening/``, ``fuzz/``, ``interop/``) and in
spawned processes.
"""
