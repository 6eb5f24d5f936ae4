"""The ``tsfront`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tsfront`` console script."""
    parser = argparse.ArgumentParser(prog="tsfront", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the demo against simulated engines (no GPU)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        print("tsfront demo: not wired yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
