"""The package's import graph, from the source: no module may take part in an import circle.

Every ``import`` and ``from ... import`` of every module under tsfront/ counts, wherever it
stands (a function body, an ``if TYPE_CHECKING:`` block): a circle that only type checking
closes still means two modules that cannot be read, or moved, one without the other.

`ALLOWED_CYCLES` is empty: tsfront has no import circle. It stays as the place a circle would
have to be admitted, with the reason and the step that breaks it; the test fails on any
circle not listed, on a listed one that grew, and on an entry whose circle is gone (so the
list only shrinks).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tsfront"

# Each entry: the exact set of modules of one strongly connected component.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The tsfront modules (of ``known``) that ``name``'s source imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    out.add(sub)  # `from tsfront.io import adoption`: the module itself
                elif source in known:
                    out.add(source)
    out.discard(name)
    return out


# Modules without Python source (the C extension; its stub is tsfront/_native.pyi).
COMPILED = {"tsfront._native"}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | COMPILED
    edges = {name: imports_of(name, path, known) for name, path in mods.items()}
    return edges | {name: set() for name in COMPILED}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle_and_only_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_every_form_of_import() -> None:
    edges = graph()
    # `from tsfront import _native, control` (a module named in a from-import) ...
    assert "tsfront.ipc.channel" in edges["tsfront.client.attachment"]
    # ... `from tsfront.io.engines import Engine` (a name of a module) ...
    assert "tsfront.io.engines" in edges["tsfront.io.routing"]
    # ... and `from tsfront import IOProcess` (a name of the package).
    assert "tsfront.process.ioproc" in edges["tsfront"]


def test_no_import_circle_in_tsfront_but_the_listed_ones() -> None:
    found = cycles(graph())
    new = [sorted(c) for c in found if c not in ALLOWED_CYCLES]
    assert not new, f"import circles (break them; never add to ALLOWED_CYCLES): {new}"
    gone = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not gone, f"these circles are gone: delete their ALLOWED_CYCLES entries: {gone}"


def test_the_shared_protocol_takes_part_in_no_circle() -> None:
    for component in cycles(graph()):
        mine = sorted(m for m in component if m.startswith("tsfront.ipc"))
        assert not mine, f"{mine} in an import circle: {sorted(component)}"


def test_ipc_imports_nothing_of_the_processes() -> None:
    # What the processes share is the bottom layer: they import it, never the reverse. (The
    # region places the metrics area where tsfront.metrics.layout says.)
    allowed = (
        "tsfront.ipc",
        "tsfront.wire",
        "tsfront.errors",
        "tsfront._native",
        "tsfront.metrics.layout",
    )
    for name, targets in graph().items():
        if name.startswith("tsfront.ipc"):
            wrong = sorted(t for t in targets if not t.startswith(allowed))
            assert not wrong, f"{name} imports {wrong}"


def test_the_worker_side_and_the_io_process_import_nothing_of_each_other() -> None:
    # The tree is the picture of docs/DESIGN.md: the I/O process (tsfront.io), the worker side
    # (tsfront.client) and what they share (tsfront.ipc); the two sides meet only there.
    edges = graph()
    sides = {"tsfront.client": "tsfront.io", "tsfront.io": "tsfront.client"}
    checked = 0
    for name, targets in edges.items():
        for side, other in sides.items():
            if name == side or name.startswith(side + "."):
                checked += 1
                wrong = sorted(t for t in targets if t == other or t.startswith(other + "."))
                assert not wrong, f"{name} imports {wrong}"
    assert checked >= 20  # both packages were found


def test_the_process_leaves_import_only_the_leaves() -> None:
    # How processes are started and live: nothing of the processes' own code.
    allowed = ("tsfront.process", "tsfront.config", "tsfront.errors", "tsfront._native")
    found = [name for name in graph() if name.startswith("tsfront.process.")]
    assert len(found) >= 4
    for name in found:
        wrong = sorted(t for t in graph()[name] if not t.startswith(allowed))
        assert not wrong, f"{name} imports {wrong}"


def test_the_leaves_import_nothing_of_the_processes() -> None:
    # config, errors, ids, install: every process may import them, so they import none.
    sides = ("tsfront.io", "tsfront.client", "tsfront.serve", "tsfront.commands")
    for leaf in ("tsfront.config", "tsfront.errors", "tsfront.ids", "tsfront.install"):
        wrong = sorted(t for t in graph()[leaf] if t.startswith(sides))
        assert not wrong, f"{leaf} imports {wrong}"


def test_the_package_root_holds_only_the_leaves() -> None:
    # Everything else lives in the package of the process it runs in (issue 40's layout).
    root = sorted(p.name for p in ROOT.glob("*.py"))
    assert root == [
        "__init__.py",
        "__main__.py",
        "config.py",
        "errors.py",
        "ids.py",
        "install.py",
    ]


def test_no_two_modules_share_a_name_across_the_processes_packages() -> None:
    # One name, one thing: io, client, ipc and process hold no two modules of the same name.
    seen: dict[str, str] = {}
    for package in ("io", "client", "ipc", "process"):
        for path in (ROOT / package).glob("*.py"):
            if path.name == "__init__.py":
                continue
            assert path.name not in seen, f"{package}/{path.name} and {seen[path.name]}"
            seen[path.name] = f"{package}/{path.name}"


# Entry points (``python -m ...``): they start the commands, nothing imports them.
ENTRY_POINTS = {"tsfront.__main__", "tsfront.sim.__main__"}


def test_no_library_module_imports_the_commands() -> None:
    # The commands sit on top (commands -> server -> client -> ipc/wire): the library, the
    # simulator, the bench suite and the test rigs never import them.
    for name, targets in graph().items():
        if name.startswith("tsfront.commands") or name in ENTRY_POINTS:
            continue
        wrong = sorted(t for t in targets if t.startswith("tsfront.commands"))
        assert not wrong, f"{name} imports {wrong}"


def test_the_stream_knows_its_slot_table_only_by_its_protocol() -> None:
    # The stream is the consumer side: it imports neither the attachment nor the slot table
    # (they import it), so the worker side reads top-down: client -> attachment -> slots ->
    # stream.
    edges = graph()
    assert (
        not {"tsfront.client.attachment", "tsfront.client.slots", "tsfront.client.engine_client"}
        & edges["tsfront.client.stream"]
    )
    assert "tsfront.client.stream" in edges["tsfront.client.slots"]
    assert "tsfront.client.slots" in edges["tsfront.client.attachment"]


def test_the_io_core_imports_neither_its_shell_nor_the_classes_it_calls_back() -> None:
    # The core is the bottom of the I/O process: the shell (io.loop), adoption and the prefill
    # group import it and are called back through its protocols, never the reverse.
    shell = {"tsfront.io.loop", "tsfront.io.adoption", "tsfront.io.disagg", "tsfront.io.main"}
    wrong = sorted(graph()["tsfront.io.core"] & shell)
    assert not wrong, f"tsfront.io.core imports {wrong}"


def test_the_text_layer_imports_nothing_of_tsfront_but_the_ids_leaf() -> None:
    # tsfront.text stands alone (docs/TEXT.md): a server built on it brings the rest. Its
    # imports from outside are two leaves: where every client-visible id comes from
    # (tsfront.ids) and the install line of a missing extra (tsfront.install); and the
    # compiled extension (the encode cache's shared store: tsfront.text.encode_cache).
    leaves = ("tsfront.ids", "tsfront.install")
    for name, targets in graph().items():
        if name.startswith("tsfront.text"):
            wrong = sorted(
                t for t in targets if not t.startswith(("tsfront.text", "tsfront._native", *leaves))
            )
            assert not wrong, f"{name} imports {wrong}"
    for leaf in leaves:
        assert not graph()[leaf], f"{leaf} is a leaf: it imports nothing of tsfront"


# The server: one core under several dialects (docs/DESIGN.md, "tsfront.serve").
SERVE = "tsfront.serve"
SERVE_CORE = "tsfront.serve.core"
SERVE_EDGE = "tsfront.serve.edge"
SERVE_PROCESSES = "tsfront.serve.processes"
# Each dialect: the shapes of one API over the core (a package or a module of tsfront.serve).
DIALECTS = (
    "tsfront.serve.anthropic",
    "tsfront.serve.openai",
    "tsfront.serve.responses",
    "tsfront.serve.tokenize",
)
# The edge modules that route a request to its dialect (the only ones that may import one).
ROUTING = {"tsfront.serve.edge.asgi"}
# What the core takes of the edge: the streamed hot path (core.push) writes a token's event to
# the connection itself, so it knows the connection's transport and request cycle.
CORE_EDGE = {"tsfront.serve.edge.transport", "tsfront.serve.edge.cycle"}
# Imports across those lines still to be removed, each with why it is there; the list only
# shrinks (a test fails on an entry whose import is gone).
CROSSINGS: dict[tuple[str, str], str] = {}


def dialect_of(name: str) -> str | None:
    return next((d for d in DIALECTS if name == d or name.startswith(d + ".")), None)


def serve_crossings(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import that breaks one of the server's rules: a dialect imports another; the core
    imports a dialect, a process or the edge (but `CORE_EDGE`); an edge module other than the
    routing imports a dialect."""
    found: set[tuple[str, str]] = set()
    for name, targets in edges.items():
        if not name.startswith(SERVE + "."):
            continue
        mine = dialect_of(name)
        for t in targets:
            theirs = dialect_of(t)
            if mine is not None and theirs is not None and theirs != mine:
                found.add((name, t))
            elif name.startswith(SERVE_CORE + "."):
                upward = theirs is not None or t.startswith((SERVE_PROCESSES, SERVE_EDGE + "."))
                if upward and t not in CORE_EDGE:
                    found.add((name, t))
            elif name.startswith(SERVE_EDGE + ".") and name not in ROUTING and theirs is not None:
                found.add((name, t))
    return found


def test_the_server_rules_see_each_kind_of_crossing() -> None:
    core, edge = "tsfront.serve.core.x", "tsfront.serve.edge.gate"
    openai, responses = "tsfront.serve.openai.y", "tsfront.serve.responses.z"
    edges = {
        openai: {responses, core},  # a dialect's import of another (found), of the core (not)
        core: {openai, "tsfront.serve.processes.store", "tsfront.serve.edge.transport"},
        edge: {openai, core},  # an edge module but the routing: no dialect
        "tsfront.serve.edge.asgi": {openai, responses},  # the routing may
    }
    assert serve_crossings(edges) == {
        (openai, responses),
        (core, openai),
        (core, "tsfront.serve.processes.store"),
        (edge, openai),
    }
    # Every dialect is found in the tree.
    assert all(d in {dialect_of(n) for n in graph()} for d in DIALECTS)


def test_dialects_import_the_core_never_each_other_and_the_core_no_dialect() -> None:
    found = serve_crossings(graph())
    new = sorted(c for c in found if c not in CROSSINGS)
    assert not new, f"imports across the server's layers (docs/DESIGN.md, tsfront.serve): {new}"
    gone = sorted(c for c in CROSSINGS if c not in found)
    assert not gone, f"these crossings are gone: delete their CROSSINGS entries: {gone}"


def test_no_two_modules_of_the_server_share_a_name() -> None:
    # One name, one thing: a module of tsfront.serve is found by its name alone, and none takes
    # the name of a module of the processes' packages.
    seen: dict[str, str] = {}
    for package in ("io", "client", "ipc", "process"):
        for path in (ROOT / package).glob("*.py"):
            seen[path.name] = f"{package}/{path.name}"
    found = 0
    for path in sorted((ROOT / "serve").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        found += 1
        where = str(path.relative_to(ROOT))
        assert path.name not in seen, f"{where} and {seen[path.name]}"
        seen[path.name] = where
    assert found >= 25
