"""The ``tsfront bench`` command: ``add_arguments(parser)`` and ``run(args) -> int``.

Progress (one line per phase, with its share of the run and the time so far) goes to stderr,
the report to stdout: a summary (`tsfront.bench.summary`: the headline figures grouped, with
units and a legend each), or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from tsfront.bench.measure import Params, run_suite


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench options to ``parser`` (a subcommand's parser)."""
    parser.add_argument(
        "suite",
        nargs="?",
        choices=["serve", "routing"],
        help="'serve': the HTTP server's CPU per streamed token against SMG "
        "(tsfront.bench.serve); 'routing': prefix-cache hit rate and load spread per placement "
        "policy (tsfront.bench.routing)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout, nothing else"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--quick", action="store_true", help="B=256, W=1 only; under a minute")
    parser.add_argument("--batches", type=_ints, help="requests per engine step, e.g. 64,256,1024")
    parser.add_argument("--workers", type=_ints, help="worker counts, e.g. 1,2,4 (first: default)")
    parser.add_argument("--ranks", type=int, help="engine ranks (each steps B requests)")
    parser.add_argument("--primary-batch", type=int, help="batch of the headline figures")
    parser.add_argument("--target-cpu", type=float, help="CPU seconds per measured burst")
    parser.add_argument("--heap-streams", type=int, help="in-flight streams for the heap figure")
    parser.add_argument("--no-uvloop", action="store_true", help="asyncio's default loop")
    parser.add_argument("--out", help="also write the full report (JSON) to this file")
    from tsfront.bench import routing, serve, smg

    serve.add_arguments(parser)
    routing.add_arguments(parser)
    smg.add_arguments(parser)


def params_from(args: argparse.Namespace) -> Params:
    """The suite's parameters from the command line (``--quick`` starts from the quick set)."""
    p = Params.quick() if args.quick else Params()
    changes = {}
    for name, field in (
        ("batches", "batches"),
        ("workers", "workers"),
        ("ranks", "ranks"),
        ("primary_batch", "primary_batch"),
        ("target_cpu", "target_cpu_s"),
        ("heap_streams", "heap_streams"),
    ):
        value = getattr(args, name, None)
        if value is not None:
            changes[field] = value
    if getattr(args, "no_uvloop", False):
        changes["uvloop"] = False
    p = dataclasses.replace(p, **changes)
    if p.primary_batch not in p.batches:
        p = dataclasses.replace(p, primary_batch=p.batches[0])
    return p


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items() if k != "latency_ns"}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    """Run the suite; print the report (JSON with ``--json``, else a summary)."""
    if getattr(args, "suite", None) == "serve":
        from tsfront.bench.serve import run_cli

        return run_cli(args)
    if getattr(args, "suite", None) == "routing":
        from tsfront.bench.routing import run_cli

        return run_cli(args)
    p = params_from(args)
    report = run_suite(p, verbose=not getattr(args, "quiet", False))
    report["params"] = dataclasses.asdict(p)
    report = _clean(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
        return 0
    from tsfront.bench.summary import summary_lines

    print("\n".join(summary_lines(report)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as ``python -m tsfront.bench.cli``; the same as ``tsfront bench``."""
    parser = argparse.ArgumentParser(prog="tsfront bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
