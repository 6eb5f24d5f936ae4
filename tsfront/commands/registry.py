"""The registry of ``tsfront`` commands.

Each command module defines one `Command` (``COMMAND``: name, help, arguments, run);
`commands` lists them in the order ``tsfront --help`` shows them. `tsfront.commands.main`
calls ``arguments`` only for the command being run (or whose ``--help`` is asked), so one
command's parser never imports another's code: the bench suite's options come from
tsfront.bench, imported only by ``tsfront bench``.
"""

from __future__ import annotations

from tsfront.commands.base import Command

__all__ = ["Command", "commands"]


def commands() -> tuple[Command, ...]:
    """Every command, in the order of ``tsfront --help``."""
    from tsfront.commands import bench, demo, generate, io, serve, sim

    return (
        demo.COMMAND,
        generate.COMMAND,
        io.COMMAND,
        sim.COMMAND,
        bench.COMMAND,
        serve.COMMAND,
    )
