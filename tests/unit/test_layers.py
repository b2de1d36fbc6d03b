"""The package's import graph: no cycles, ``_runtime`` never imports upward, small modules.

The graph is read from the source with ``ast`` (nothing is imported) and counts every
import: at module level, under ``if TYPE_CHECKING:``, inside functions, and
``importlib.import_module("nbcluster...")`` with a literal name. An import inside a
function that closes a loop still ties the two modules together, and a type-only import
still means the two modules cannot be understood (or moved) apart.

Layers (DESIGN.md): ``nbcluster._runtime`` is the bottom; it may import only itself (and
third-party code). Everything else sits above it.

:data:`ALLOWED` lists, edge by edge, what is still wrong today (the big driver circle and
the runtime's upward imports, which the driver-interface work removes). Any other edge
that closes a cycle or points upward fails, and so does an entry that no longer exists.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbcluster"
RUNTIME = "nbcluster._runtime"
MAX_LINES = 800
#: Generated modules (protobuf) are exempt from the size rule.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")

#: The only edges tolerated, each an exact ``(importer, imported)`` pair, no wildcards: none
#: is left (issue 11, item 2 paid them all off). Never add one.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


#: Modules still over :data:`MAX_LINES`, each with its size today as a ceiling (it may
#: shrink, not grow); delete an entry once its module is under the limit (the test fails
#: on an entry that is).
OVERSIZED: dict[str, int] = {}


@dataclasses.dataclass
class Edge:
    """One module importing another: where (first line) and which names."""

    line: int
    names: set[str] = dataclasses.field(default_factory=set)


Graph = dict[str, dict[str, Edge]]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _closest(name: str, known: set[str]) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _literal_import(node: ast.Call) -> str | None:
    """``importlib.import_module("nbcluster.x")`` / ``__import__("nbcluster.x")``."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def imports(
    module: str, path: Path, known: set[str], root_name: str = "nbcluster"
) -> Iterator[tuple[str, int, str]]:
    """``(imported module, line, name taken)`` for every import in ``path``, wherever it is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root_name:
                    yield _closest(alias.name, known), node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            if target.split(".")[0] != root_name:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module.
                if sub in known:
                    yield sub, node.lineno, alias.name
                else:
                    yield _closest(target, known), node.lineno, alias.name
        elif isinstance(node, ast.Call):
            name = _literal_import(node)
            if name is not None and name.split(".")[0] == root_name:
                yield _closest(name, known), node.lineno, f"import_module({name!r})"


def graph(root: Path = PACKAGE) -> Graph:
    """``importer -> imported -> Edge`` for every module of the package under ``root``
    (read once per root; do not change what it returns)."""
    return _graph(root)


@functools.cache
def _graph(root: Path) -> Graph:
    mods = modules(root)
    known = set(mods)
    out: Graph = {}
    for name, path in mods.items():
        edges: dict[str, Edge] = {}
        for target, line, taken in imports(name, path, known, root.name):
            if target and target != name:
                edges.setdefault(target, Edge(line)).names.add(taken)
        out[name] = edges
    return out


def cycles(g: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def enter(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)

    for start in sorted(g):
        if start in index:
            continue
        enter(start)
        work = [(start, iter(sorted(g.get(start, {}))))]
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    enter(w)
                    work.append((w, iter(sorted(g.get(w, {})))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _file(module: str, mods: dict[str, Path]) -> str:
    """``nbcluster/x/y.py`` for ``nbcluster.x.y``."""
    path = mods.get(module)
    if path is None:
        return module
    depth = len(module.split(".")) - (0 if path.name == "__init__.py" else 1)
    return str(path.relative_to(path.parents[depth]))


def describe_cycle(g: Graph, comp: list[str], mods: dict[str, Path]) -> str:
    """The cycle's files, and each edge inside it with its line and the names it takes."""
    members = set(comp)
    lines = [f"import cycle of {len(comp)} modules: " + ", ".join(_file(m, mods) for m in comp)]
    for a in comp:
        for b, edge in sorted(g[a].items()):
            if b in members:
                names = ", ".join(sorted(edge.names))
                lines.append(f"  {_file(a, mods)}:{edge.line} imports {b}: {names}")
    return "\n".join(lines)


def without(g: Graph, allowed: frozenset[tuple[str, str]]) -> Graph:
    """``g`` minus the allowed edges."""
    return {a: {b: e for b, e in edges.items() if (a, b) not in allowed} for a, edges in g.items()}


def is_upward(importer: str, imported: str, runtime: str = RUNTIME) -> bool:
    """True for an import from the runtime of a module outside it (the package face too)."""
    inside = importer == runtime or importer.startswith(runtime + ".")
    target_inside = imported == runtime or imported.startswith(runtime + ".")
    return inside and not target_inside


def cycle_report(root: Path, allowed: frozenset[tuple[str, str]]) -> list[str]:
    """One message per cycle left once the allowed edges are removed."""
    g = graph(root)
    mods = modules(root)
    rest = without(g, allowed)
    return [describe_cycle(rest, comp, mods) for comp in cycles(rest)]


def upward_report(
    root: Path, allowed: frozenset[tuple[str, str]], runtime: str = RUNTIME
) -> list[str]:
    """One message per import from the runtime into the layers above, not allowed."""
    g = graph(root)
    mods = modules(root)
    return [
        f"{_file(a, mods)}:{edge.line} imports {b}: {', '.join(sorted(edge.names))}"
        for a, edges in sorted(g.items())
        for b, edge in sorted(edges.items())
        if is_upward(a, b, runtime) and (a, b) not in allowed
    ]


# -- the package ---------------------------------------------------------------------------------


def test_the_graph_is_read() -> None:
    g = graph()
    assert len(g) > 300
    # Module level, relative, inside a function and TYPE_CHECKING imports are all edges.
    assert "nbcluster._api" in g["nbcluster"]
    assert "nbcluster._runtime.worker.concurrency" in g["nbcluster._runtime.worker.actor_runner"]
    assert "nbcluster.jupyter.magics" in g["nbcluster"]  # inside load_ipython_extension()


def test_no_import_cycles() -> None:
    found = cycle_report(PACKAGE, ALLOWED)
    assert not found, "\n".join(found)


def test_the_runtime_never_imports_the_layers_above() -> None:
    bad = upward_report(PACKAGE, ALLOWED)
    assert not bad, "nbcluster._runtime imports the package above it:\n" + "\n".join(bad)


#: Packages that DESIGN.md (section 6) puts on the public API and ``state.py`` alone.
ON_THE_PUBLIC_API = (
    "nbcluster.data",
    "nbcluster.train",
    "nbcluster.tune",
    "nbcluster.serve",
    "nbcluster.job_submission",
    "nbcluster.dag",
    "nbcluster.jupyter",
)


def test_the_libraries_and_the_jupyter_layer_never_import_the_runtime() -> None:
    g = graph()
    mods = modules()
    bad = [
        f"{_file(a, mods)}:{edge.line} imports {b}"
        for a, edges in sorted(g.items())
        if any(a == p or a.startswith(p + ".") for p in ON_THE_PUBLIC_API)
        for b, edge in sorted(edges.items())
        if b == RUNTIME or b.startswith(RUNTIME + ".")
    ]
    assert not bad, "use the public API or nbcluster.state instead:\n" + "\n".join(bad)


def test_every_allowed_edge_still_exists_and_is_a_debt() -> None:
    g = graph()
    comps = cycles(g)
    gone = sorted(pair for pair in ALLOWED if pair[1] not in g.get(pair[0], {}))
    assert not gone, "these imports are gone: delete them from ALLOWED:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in gone
    )
    in_a_cycle = {(a, b) for comp in comps for a in comp for b in comp}
    other = sorted(pair for pair in ALLOWED if not is_upward(*pair) and pair not in in_a_cycle)
    assert not other, "ALLOWED may only hold upward imports and edges of a cycle:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in other
    )


def test_modules_stay_small() -> None:
    big = []
    sizes: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith(GENERATED_SUFFIXES):
            continue
        rel = path.relative_to(PACKAGE.parent).as_posix()
        n = sizes[rel] = len(path.read_text(encoding="utf-8").splitlines())
        if n > OVERSIZED.get(rel, MAX_LINES):
            big.append(f"{rel}: {n} lines")
    assert not big, f"modules over {MAX_LINES} lines (split them by role):\n" + "\n".join(big)
    done = sorted(rel for rel in OVERSIZED if sizes.get(rel, 0) <= MAX_LINES)
    assert not done, "under the limit now: delete from OVERSIZED: " + ", ".join(done)


# -- the checker itself, on small made-up packages -----------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "nbcluster"
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


@pytest.mark.parametrize(
    "source",
    [
        "import nbcluster.b\n",
        "from nbcluster import b\n",
        "from nbcluster.b import name\n",
        "from .b import name\n",
        "def f():\n    from . import b\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nbcluster.b import name\n",
        "import importlib\ndef f():\n    return importlib.import_module('nbcluster.b')\n",
    ],
)
def test_every_kind_of_import_is_an_edge(tmp_path: Path, source: str) -> None:
    root = _package(tmp_path, {"a.py": source, "b.py": "name = 1\n"})
    assert set(graph(root)["nbcluster.a"]) == {"nbcluster.b"}


def test_a_cycle_is_reported_with_its_files_and_names(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "from nbcluster.b import helper\n",
            "b.py": "def helper():\n    from nbcluster.c import Thing\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
            "d.py": "from nbcluster import a\n",
        },
    )
    (report,) = cycle_report(root, frozenset())
    assert "import cycle of 3 modules: nbcluster/a.py, nbcluster/b.py, nbcluster/c.py" in report
    assert "nbcluster/b.py:2 imports nbcluster.c: Thing" in report
    assert "nbcluster/c.py:3 imports nbcluster.a: x" in report
    # An allowed edge of the cycle breaks it; any other edge does not.
    assert cycle_report(root, frozenset({("nbcluster.c", "nbcluster.a")})) == []
    assert cycle_report(root, frozenset({("nbcluster.d", "nbcluster.a")})) != []


def test_a_package_and_its_submodule_can_form_a_cycle() -> None:
    assert cycles({"p": {"p.x": 1}, "p.x": {"p": 1}}) == [["p", "p.x"]]
    assert cycles({"p.a": {"p.b": 1}, "p.b": {"p.c": 1}, "p.c": {"p.a": 1}, "p.d": {"p.a": 1}}) == [
        ["p.a", "p.b", "p.c"]
    ]


def test_an_upward_import_from_the_runtime_is_reported(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "_runtime/__init__.py": "",
            "_runtime/core.py": "def f():\n    import nbcluster\n    from nbcluster.api import g\n",
            "_runtime/low.py": "from nbcluster._runtime import core\n",
            "api.py": "from nbcluster._runtime.core import f\ndef g(): ...\n",
        },
    )
    assert upward_report(root, frozenset()) == [
        "nbcluster/_runtime/core.py:2 imports nbcluster: nbcluster",
        "nbcluster/_runtime/core.py:3 imports nbcluster.api: g",
    ]
    assert upward_report(root, frozenset({("nbcluster._runtime.core", "nbcluster")})) == [
        "nbcluster/_runtime/core.py:3 imports nbcluster.api: g"
    ]
