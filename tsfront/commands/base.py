"""What every ``tsfront`` command shares: its errors, exit statuses and progress lines.

An error is one line on stderr, ``tsfront: error: ...``, and a non-zero exit: `USAGE_EXIT` (2)
for a bad command line (`UsageError`: an unknown option, a malformed address, a value out of
range; the line ends with ``see 'tsfront CMD --help'``), a missing extra (`MissingExtra`) or
something the command line names held by another program (`InUse`: a port in use),
`ERROR_EXIT` (1) for anything else, `INTERRUPTED_EXIT` (130) when interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import NoReturn

from tsfront.errors import Error, MissingExtra

__all__ = [
    "ERROR_EXIT",
    "INTERRUPTED_EXIT",
    "USAGE_EXIT",
    "Command",
    "CommandError",
    "InUse",
    "MissingExtra",
    "Parser",
    "UsageError",
    "one_line",
    "progress",
]

USAGE_EXIT = 2
ERROR_EXIT = 1
INTERRUPTED_EXIT = 130


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``tsfront`` command."""

    name: str
    #: One line for ``tsfront --help``.
    help: str
    #: The paragraph of ``tsfront NAME --help``.
    description: str
    #: Adds the command's options to its parser.
    arguments: Callable[[argparse.ArgumentParser], None]
    #: Runs the command with the parsed options; returns the exit status.
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None


class CommandError(Error):
    """A command cannot go on (bad input file, ...); reported as one line, exit 1."""


class UsageError(CommandError):
    """The command line asks for something impossible (exit 2, with a pointer to ``--help``).

    ``prog`` is the command whose help to read, e.g. ``"tsfront generate"``.
    """

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        super().__init__(message)


class InUse(CommandError):
    """Something the command line names is held by another program (a port in use): one line
    naming it, exit 2 (as a bad command line, without the pointer to ``--help``)."""


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors become one line instead of usage plus a message."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


def one_line(text: object) -> str:
    """``text`` as a single line (newlines folded)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def progress(command: str, message: str) -> None:
    """Write one progress line of ``tsfront COMMAND`` to stderr."""
    sys.stderr.write(f"tsfront {command}: {message}\n")
    sys.stderr.flush()
