"""The committed golden vectors are exactly what TokenSpeed 0.1.1's classes produce today."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "golden_vectors.json"
REGEN = Path(__file__).resolve().parent / "golden_regen.py"
CARRIED_OVER = {"output_v10_aug12", "output_v9_aug3", "ready_response_aug22", "ready_response_aug3"}


def _regen(python: Path, src: Path, out: Path) -> str:
    proc = subprocess.run(
        [str(python), str(REGEN), "--src", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out.read_text(encoding="utf-8")


def test_committed_golden_file_matches_regeneration_byte_for_byte(interop_python, tmp_path):
    fresh = _regen(interop_python, GOLDEN, tmp_path / "golden.json")
    committed = GOLDEN.read_text(encoding="utf-8")
    new_doc, old_doc = json.loads(fresh), json.loads(committed)
    differing = [name for name in old_doc if new_doc.get(name) != old_doc[name]]
    assert differing == [], f"regenerated entries differ from the committed copy: {differing}"
    assert fresh.encode() == committed.encode()


def test_regeneration_rebuilds_0_1_1_entries_and_only_carries_over_old_snapshots(
    interop_python, tmp_path
):
    # Tamper with every entry's bytes: regenerated ones must come back, carried-over ones not.
    doc = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for name, entry in doc.items():
        if name != "_meta":
            entry["hex"] = "00"
    src = tmp_path / "tampered.json"
    src.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    fresh = json.loads(_regen(interop_python, src, tmp_path / "out.json"))
    still_tampered = {
        name for name, entry in fresh.items() if name != "_meta" and entry["hex"] == "00"
    }
    assert still_tampered == CARRIED_OVER
