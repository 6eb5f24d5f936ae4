"""``tsfront bench``: the throughput suite, a tool of its own tree (tsfront.bench).

Its options and its run are the suite's (`tsfront.bench.cli`), imported only when this command
is the one being run, so no other command's parser loads the suite or its dependencies (the
``bench`` extra).
"""

from __future__ import annotations

import argparse

from tsfront.commands.base import Command

__all__ = ["COMMAND", "arguments", "run"]


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the suite's options to ``parser``."""
    from tsfront.bench import cli

    cli.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the suite, or its ``serve`` / ``routing`` part; returns the exit status."""
    from tsfront.bench import cli

    return cli.run(args)


COMMAND = Command(
    name="bench",
    help="run the throughput suite (I/O process, workers, baselines)",
    description="Measure tsfront against the floor and the designs users would pick "
    "instead, on replayed engine frames; --quick finishes in under a minute.",
    arguments=arguments,
    run=run,
)
