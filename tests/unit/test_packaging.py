"""What a wheel of tsfront holds: every package of the source tree and the type information.

A package missing from the build configuration still imports from a checkout (and from an
editable install), so only an installed copy shows it: ``tsfront.commands`` was once left
out, and ``pip install . && tsfront demo`` failed on a fresh machine with
``ModuleNotFoundError``. The check runs setuptools' own ``build_py`` (what ``pip install .``
copies, without compiling the extension) into a temporary folder and compares it with the
source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _packages(root: Path) -> set[str]:
    return {
        ".".join(p.parent.relative_to(root).parts) for p in (root / "tsfront").rglob("__init__.py")
    }


def _clean_copy(dest: Path) -> Path:
    """The files git tracks, as a fresh clone has them: the checkout's own ``*.egg-info``
    (left by the editable install) lists every module, and an in-tree build copies what it
    lists whatever the configuration says."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, timeout=60
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / name.decode())
    return dest


def test_the_build_copies_every_package_and_the_type_information(tmp_path: Path) -> None:
    tree = _clean_copy(tmp_path / "src")
    out = tmp_path / "lib"
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(out)],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=120,
    )
    source = _packages(tree)
    assert {"tsfront", "tsfront.commands", "tsfront.serve", "tsfront.testing"} <= source
    assert _packages(out) == source
    for name in ("py.typed", "_native.pyi"):
        assert (out / "tsfront" / name).is_file(), name
    # Every module of every package, not only the packages.
    modules = {p.relative_to(tree) for p in (tree / "tsfront").rglob("*.py")}
    assert {p.relative_to(out) for p in (out / "tsfront").rglob("*.py")} == modules


def test_every_install_line_in_the_docs_and_messages_works_from_a_checkout() -> None:
    # tsfront is installed from its checkout, not a package index: `pip install 'tsfront[x]'`
    # cannot work, `pip install '.[x]'` in the checkout (or the checkout's path) does.
    import re

    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "examples").rglob("*")]
    files += list((root / "tsfront").rglob("*.py"))
    bad = []
    for path in files:
        if path.is_file() and path.suffix in (".md", ".py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"pip install [^\n]*'tsfront\[", line):
                    bad.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)
