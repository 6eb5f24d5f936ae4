"""Plots for docs/PERFORMANCE.md from a ``tsfront bench --out report.json`` file.

``python -m tsfront.bench.plots report.json docs/`` writes ``bench_batch.png``,
``bench_workers.png`` and ``bench_latency.png``. matplotlib is needed only here and is not a
dependency of tsfront: install it into a scratch environment to regenerate the figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Draw the PNG plots of docs/PERFORMANCE.md from a ``tsfront bench --out`` report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    by_batch = {int(k): v for k, v in report["by_batch"].items()}
    batches = sorted(by_batch)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [
        ("tsfront I/O process", lambda e: e["tsfront"]["io_request_steps_per_s"]),
        ("floor: PULL recv only", lambda e: e["recv"]["request_steps_per_s"]),
        ("floor: recv + msgspec decode", lambda e: e["decode"]["request_steps_per_s"]),
        ("per-batch forwarding I/O", lambda e: e["forward"]["request_steps_per_s"]),
        ("single asyncio process", lambda e: e["single"]["request_steps_per_s"]),
    ]
    for label, get in series:
        ax.plot(batches, [get(by_batch[b]) for b in batches], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("requests per engine step (B)")
    ax.set_ylabel("request-steps (tokens) per CPU-second")
    ax.set_title("Output path capacity per core, by batch size (W=1, R=1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench_batch.png", dpi=110)
    plt.close(fig)

    by_w = {int(k): v for k, v in report["by_workers"].items()}
    if by_w:
        ws = sorted(by_w)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(
            ws,
            [by_w[w]["tsfront"]["io_cpu_s_per_mtok"] for w in ws],
            marker="o",
            label="tsfront I/O process",
        )
        ax.plot(
            ws,
            [by_w[w]["forward"]["cpu_s_per_mtok"] for w in ws],
            marker="o",
            label="per-batch forwarding I/O",
        )
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.set_xlabel("worker processes (W)")
        ax.set_ylabel("I/O CPU seconds per million tokens")
        ax.set_ylim(bottom=0)
        ax.set_title(f"I/O CPU per token vs workers (B={report['params']['primary_batch']})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "bench_workers.png", dpi=110)
        plt.close(fig)

    primary = by_batch[int(report["params"]["primary_batch"])]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("latency_busy", "engine send -> task, worker busy"),
        ("latency_parked", "engine send -> task, worker parked"),
        ("zmq_hop", "engine send -> PULL recv (ZMQ hop alone)"),
    ):
        cdf = primary.get(key, {}).get("cdf") or []
        if cdf:
            ax.plot([us for _, us in cdf], [q for q, _ in cdf], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (µs)")
    ax.set_ylabel("fraction of chunks")
    ax.set_title(f"Latency CDF (B={report['params']['latency_batch']}, paced)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench_latency.png", dpi=110)
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
