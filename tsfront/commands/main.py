"""``tsfront``'s entry point: parse the command line, run the command, map errors to exits.

The commands are in `tsfront.commands.registry`; only the one being run has its options
declared (and its module's dependencies imported). Progress goes to stderr, results to
stdout; an error is one line on stderr with the exit statuses of `tsfront.commands.base`.

``TSFRONT_LOG=LEVEL`` (e.g. ``INFO``, ``DEBUG``) shows the ``tsfront.*`` loggers of this
process and of the I/O process it starts on stderr; unset, the commands keep them quiet.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tsfront.commands.base import (
    ERROR_EXIT,
    INTERRUPTED_EXIT,
    USAGE_EXIT,
    InUse,
    MissingExtra,
    Parser,
    UsageError,
    one_line,
)
from tsfront.commands.registry import commands
from tsfront.errors import Error

__all__ = ["build_parser", "main"]

DESCRIPTION = (
    "The tsfront command: a demo, a one-shot generator, a standalone I/O process, simulators, "
    "the throughput suite and the OpenAI-compatible server."
)

# Options whose value is a list of token ids: "-5,3" must be read as their value, not as an
# unknown option, so that the refusal says what is wrong with it (token ids are >= 0).
_ID_OPTIONS = ("--input-ids", "--stop-token-ids")


def _join_id_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in _ID_OPTIONS:
            value = next(it, None)
            if value is not None and value.startswith("-") and value[1:2].isdigit():
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


def _chosen(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word (the top level's options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The ``tsfront`` command line, with the options of the command ``chosen`` (only)."""
    from tsfront import __version__

    parser = Parser(
        prog="tsfront",
        description=DESCRIPTION,
        epilog="Run 'tsfront COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"tsfront {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands():
        cmd = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            epilog=command.epilog,
        )
        if command.name == chosen:
            command.arguments(cmd)
        cmd.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tsfront`` console script; returns the exit status."""
    argv = _join_id_values(list(sys.argv[1:] if argv is None else argv))
    level = os.environ.get("TSFRONT_LOG")
    if level:
        try:
            logging.basicConfig(
                level=level.upper(),
                format="tsfront[%(process)d] %(name)s %(levelname)s %(message)s",
            )
        except ValueError:
            _error(f"TSFRONT_LOG={level!r}: not a logging level; use DEBUG, INFO, WARNING or ERROR")
            return USAGE_EXIT
    try:
        parser = build_parser(_chosen(argv))
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else 0
        if extra:
            # Unknown options belong to the subcommand: point at its help, not the top level's.
            raise UsageError(
                f"tsfront {args.command}", f"unrecognized arguments: {' '.join(extra)}"
            )
        args.argv = argv[argv.index(args.command) + 1 :]
        return int(args.run(args) or 0)
    except UsageError as exc:
        hint = f" (see '{exc.prog} --help')"
        _error(f"{one_line(exc)}{hint}")
        return USAGE_EXIT
    except (MissingExtra, InUse) as exc:
        _error(one_line(exc))
        return USAGE_EXIT
    except KeyboardInterrupt:
        _error("interrupted")
        return INTERRUPTED_EXIT
    except Error as exc:
        _error(one_line(exc))
        return ERROR_EXIT
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        _error(f"{exc.strerror or exc}{where}")
        return ERROR_EXIT


def _error(message: str) -> None:
    try:
        sys.stderr.write(f"tsfront: error: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
