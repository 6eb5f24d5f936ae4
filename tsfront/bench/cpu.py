"""A process's CPU time, by the two clocks Linux keeps of it.

``cpu_ns``: the sum of its live threads' time on a CPU (``/proc/PID/task/*/schedstat``, the
scheduler's ``sum_exec_runtime``), in ns; a thread that has ended is no longer in it.
``cpu_stat_ns``: utime + stime of ``/proc/PID/stat``, every thread the process ever had, in
clock ticks (10 ms here). The benchmarks read the first and keep the second to check it.
"""

from __future__ import annotations

import glob
import os

__all__ = ["TICK_NS", "cpu_ns", "cpu_stat_ns"]

#: One clock tick, in ns.
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int | str) -> int:
    """utime + stime of a whole process in ns (sum of its threads' ``sum_exec_runtime``)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended between the listing and the read
    return total


def cpu_stat_ns(pid: int | str) -> int:
    """utime + stime from ``/proc/<pid>/stat`` (clock-tick resolution), in ns."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_NS
