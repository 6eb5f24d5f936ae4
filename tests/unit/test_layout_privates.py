"""No module reaches into another module's private (_underscore) names.

From the source, with ast, per module under tsfront/: a ``from M import _x`` or ``M._x`` of
another tsfront module, and any ``obj._x`` whose ``_x`` this module does not itself define (as
a function, a class attribute, a ``self._x`` it assigns, a slot): that one is some other
module's private. Dunders are the language's, and a few private names are public API of the
standard library or a dependency (`STDLIB_PRIVATE_API`).

`ALLOWED` lists what remains outside the I/O process and the shared protocol, per module, each
owned by a later step of issue 19 that removes it. The test fails on any reach not listed, and
on a listed one that is gone (so the list only shrinks).
"""

from __future__ import annotations

import ast
import pathlib

from test_layout_imports import modules

# Private by name, public by contract: namedtuple's methods, os._exit, sys._getframe.
STDLIB_PRIVATE_API = {"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe"}

# module → the foreign private names it still uses, and whose step removes them.
ALLOWED: dict[str, set[str]] = {}


def defined_privates(tree: ast.AST) -> set[str]:
    """Private names this module defines itself."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)  # self._x = ..., and any obj._x it assigns
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, getattr(self, "_x")
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rpartition(".")[2])
    return {n for n in names if n.startswith("_")}


def foreign_privates(path: pathlib.Path) -> set[str]:
    """The private names of other modules that the module at ``path`` uses."""
    tree = ast.parse(path.read_text(), str(path))
    mine = defined_privates(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tsfront"):
            found |= {
                a.name
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__") and a.name != "_native"
            }
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in STDLIB_PRIVATE_API:
                continue
            if name not in mine:
                found.add(name)
    return found


def test_the_rule_sees_a_reach_into_another_objects_privates(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from tsfront.io.loop import _u32\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, loop):\n"
        "        loop._kill(self._mine, self._g())\n"
        "    def _g(self):\n"
        "        return 2\n"
    )
    assert foreign_privates(source) == {"_u32", "_kill"}


def test_no_module_uses_another_modules_private_names() -> None:
    found = {name: foreign_privates(path) for name, path in modules().items()}
    new = {m: sorted(names - ALLOWED.get(m, set())) for m, names in found.items()}
    new = {m: names for m, names in new.items() if names}
    assert not new, f"private names of other modules in use: {new}"
    gone = {m: sorted(names - found.get(m, set())) for m, names in ALLOWED.items()}
    gone = {m: names for m, names in gone.items() if names}
    assert not gone, f"no longer used: delete them from ALLOWED: {gone}"
