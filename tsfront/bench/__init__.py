"""``tsfront.bench``: the throughput suite (issue #5).

* :mod:`~tsfront.bench.replay` — engines that handshake like TokenSpeed ranks, then replay
  pre-encoded (optionally time-stamped) output frames at full speed or paced;
* :mod:`~tsfront.bench.baselines` — the designs tsfront is compared with, on the same frames:
  a bare PULL, PULL + msgspec decode, per-batch forwarding, one asyncio process;
* :mod:`~tsfront.bench.measure` — sessions, phases, CPU accounting from /proc, the figures;
* :mod:`~tsfront.bench.cli` — the suite's options and run (``--json``, ``--quick``), for the
  ``tsfront bench`` command (`tsfront.commands.bench`) and ``python -m tsfront.bench.cli``.

See docs/PERFORMANCE.md for what each figure includes.
"""

from tsfront.bench.measure import Params, run_suite

__all__ = ["Params", "run_suite"]
