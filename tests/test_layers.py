"""The architecture rules, checked on the source: layer order, no import cycles, short modules.

Every ``import`` in ``src/treadle`` is read with :mod:`ast` — module-level, function-level and
``if TYPE_CHECKING:`` ones alike — and resolved to the module it names (``from treadle.x import
y`` names ``treadle.x.y`` when that is a module, else ``treadle.x``). The layer table below is
the one ``docs/ARCHITECTURE.md`` draws.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "treadle"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "names", "fastpaths", "layout", "concurrency", "fork_locks", "reaper"),
    ("storage",),  # obstore only
    ("video",),  # codec, containers, pure frame specs
    ("table",),  # pinned Lance reads, fragment staging
    ("plan",),  # pure
    ("read",),  # delivery stages, prefetch
    ("stats",),  # table and run statistics
    ("catalog",),  # client, projects (their statistics), branches, TableRef, Transaction, gc
    ("workers",),  # worker processes, their server and slots
    ("gpu", "info"),
    ("torch",),
    ("importers",),
    ("cli", "demo", "bench", "ui"),
]
"""Lowest first: a module may import from its own layer or lower ones."""

FLOATING = {"treadle", "treadle.testing", "treadle.transforms", "treadle.lerobot"}
"""Modules that sit where their imports put them (the package facade, test and transform
helpers): their layer is the highest of what they import, and whoever imports them must be at
least that high."""

MAX_LINES = 400

LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    return {module_name(p, src): p for p in sorted((src / "treadle").rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, imported treadle module)`` for every import statement of one module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if sub in known else target))
    ours = {(line, m) for line, m in out if m == "treadle" or m.startswith("treadle.")}
    return sorted(ours)


def type_only_lines(path: Path) -> set[int]:
    """Lines of the imports under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (
            (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        ):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def graph(src: Path = SRC, *, runtime: bool = False) -> dict[str, list[tuple[int, str]]]:
    """Each module's imports (``runtime``: without the ``TYPE_CHECKING`` ones)."""
    known = modules(src)
    g = {}
    for name, path in known.items():
        skip = type_only_lines(path) if runtime else set()
        g[name] = [(n, m) for n, m in imports(name, path, known) if n not in skip]
    return g


def layer(module: str, g: dict[str, list[tuple[int, str]]], seen: tuple[str, ...] = ()) -> int:
    """The layer of a module: its top-level package's, or for a floating one its imports'."""
    if module not in FLOATING:
        top = module.split(".")[1]
        assert top in LAYER_OF, f"{module} is in no layer: add {top!r} to LAYERS"
        return LAYER_OF[top]
    deps = [m for _, m in g.get(module, []) if m != module and m not in seen]
    return max((layer(m, g, (*seen, module)) for m in deps), default=0)


def cycles(g: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for _, w in g.get(v, []):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or any(m == v for _, m in g.get(v, [])):
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def violations(g: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Each import of a module from a higher layer, as ``module (line N) imports other``."""
    return [
        f"{module} (line {line}) imports {dep}"
        for module, deps in sorted(g.items())
        for line, dep in deps
        if dep in g and layer(dep, g) > layer(module, g)
    ]


def test_the_import_parser_sees_every_kind_of_import(tmp_path):
    """The checker itself: function-level, TYPE_CHECKING and relative imports all count."""
    pkg = tmp_path / "treadle"
    (pkg / "plan").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "plan" / "__init__.py").write_text("")
    (pkg / "catalog").mkdir()
    (pkg / "catalog" / "__init__.py").write_text("")
    (pkg / "catalog" / "client.py").write_text("def g():\n    from treadle.plan import x\n")
    (pkg / "plan" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "if TYPE_CHECKING:\n"
        "    from treadle.catalog import client\n"
        "def f():\n"
        "    from ..errors import TreadleError\n"
        "    import treadle.catalog.client as c\n"
        "from . import y\n"
    )
    (pkg / "plan" / "y.py").write_text("from treadle.plan.x import f\n")
    g = graph(tmp_path)
    assert g["treadle.plan.x"] == [
        (4, "treadle.catalog.client"),
        (6, "treadle.errors"),
        (7, "treadle.catalog.client"),
        (8, "treadle.plan.y"),
    ]
    assert cycles(g) == [["treadle.catalog.client", "treadle.plan.x", "treadle.plan.y"]]
    assert graph(tmp_path, runtime=True)["treadle.plan.x"] == g["treadle.plan.x"][1:]
    assert violations(g) == [  # catalog is above plan: plan may not import it, even for types
        "treadle.plan.x (line 4) imports treadle.catalog.client",
        "treadle.plan.x (line 7) imports treadle.catalog.client",
    ]


def test_no_import_cycles():
    """No cycle among all imports: module- and function-level, and type-only ones
    (``TYPE_CHECKING``) too. Where a module names a type of the module that creates it (a
    transaction's branch, gc's project), it names a Protocol of what it uses instead."""
    found = cycles(graph())
    assert found == [], "import cycles (each a group of modules that import each other): " + (
        "; ".join(" <-> ".join(c) for c in found)
    )


def packages(g: dict[str, list[tuple[int, str]]]) -> dict[str, list[tuple[int, str]]]:
    """The same graph between top-level packages (``treadle.catalog``, ``treadle.errors``)."""

    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, list[tuple[int, str]]] = {top(m): [] for m in g}
    for m, deps in g.items():
        out[top(m)] += [(n, top(d)) for n, d in deps if top(d) != top(m) and d in g]
    return out


def test_no_package_cycles():
    """Nor between packages (a folder, or a module at the top): no two import each other,
    even through others in one layer (``errors`` and ``layout`` share the bottom one)."""
    found = cycles(packages(graph()))
    assert found == [], "package cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_package_graph_sees_a_cycle_between_two_packages():
    g = {
        "treadle.a.x": [(1, "treadle.b.y")],
        "treadle.b.y": [],
        "treadle.b.z": [(3, "treadle.a.x")],
    }
    assert cycles(g) == []  # no cycle between modules
    assert cycles(packages(g)) == [["treadle.a", "treadle.b"]]


def test_imports_follow_the_layer_order():
    bad = violations(graph())
    assert bad == [], "imports against the layer order:\n  " + "\n  ".join(bad)


def same_file_names(src: Path = SRC) -> dict[str, list[str]]:
    """File names (not ``__init__.py``/``__main__.py``) that more than one module has."""
    seen: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(src)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_two_modules_share_a_file_name():
    """One concept per module, named for it: two ``forks.py`` (locks renewed in a forked
    child; obstore guarded after a fork) were two concepts under one name."""
    assert same_file_names() == {}


def test_the_file_name_check_sees_a_shared_name(tmp_path):
    for path in ("treadle/forks.py", "treadle/storage/forks.py", "treadle/cli/__init__.py",
                 "treadle/__init__.py", "treadle/a/__main__.py", "treadle/__main__.py"):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert same_file_names(tmp_path) == {
        "forks.py": ["treadle/forks.py", "treadle/storage/forks.py"]
    }


def test_no_module_is_too_long():
    lengths = {
        p.relative_to(SRC).as_posix(): len(p.read_text().splitlines())
        for p in PACKAGE.rglob("*.py")
    }
    long = sorted(f"{p} ({n} lines)" for p, n in lengths.items() if n > MAX_LINES)
    assert long == [], f"modules over {MAX_LINES} lines: " + ", ".join(long)


@pytest.mark.parametrize("name", sorted(FLOATING))
def test_floating_modules_exist(name):
    assert name in modules()


def test_the_architecture_diagram_is_this_layer_table():
    """Layers are drawn top first, separated by ``|`` lines; a layer's names may take two
    lines; its description starts after three spaces or more."""
    text = (SRC.parent / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    drawn: list[set[str]] = [set()]
    for line in block.splitlines():
        if line.strip().startswith("|"):
            drawn.append(set())
        elif line.strip() and len(line) - len(line.lstrip()) <= 20:  # not a description's
            head = re.split(r"\s{3,}", line.strip(), maxsplit=1)[0]
            drawn[-1] |= {w.rstrip("/").removesuffix(".py") for w in head.split()}
    assert [d for d in reversed(drawn) if d] == [set(layer) for layer in LAYERS]


MAX_FUNCTION_LINES = 60


def test_no_function_is_too_long():
    """One idea per function: none in src/ over 60 lines (a table of cases would be the
    exception; there is none today)."""
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(SRC).as_posix()}:{node.lineno} {node.name} ({n})")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(long)


SEAM_PARAMETERS = {"table", "tables", "store", "project", "backend", "place", "history"}
"""Parameters that cross packages: a table (``table/``), a store (``storage/``), a project
(``catalog/``, or the :class:`~treadle.table.table.TableSource` a table needs of it), a
project's place or history (what gc and retention read of it: ``catalog/place.py``,
``catalog/history.py``), a decode backend (:class:`~treadle.video.protocols.VideoBackend`)."""


def untyped_seams(path: Path) -> list[str]:
    """``function(parameter)`` for each seam parameter of ``path`` typed ``Any`` (or a
    container of ``Any``) or not typed at all."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            if arg.arg not in SEAM_PARAMETERS:
                continue
            text = ast.unparse(arg.annotation) if arg.annotation else "Any"
            if re.search(r"\bAny\b", text):
                out.append(f"{node.name}({arg.arg})")
    return out


def test_the_seam_checker_sees_any(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(
        "def f(table: Any, store: Store, tables: Sequence[Any], project=None, x: Any = 1): ...\n"
        "def g(backend: 'Any'): ...\n"
    )
    assert untyped_seams(p) == ["f(table)", "f(tables)", "f(project)", "g(backend)"]


def test_no_cross_package_parameter_is_typed_any():
    """A table, store, project or backend passed between packages has its type (or a
    Protocol of what is used of it), so the layer test cannot be passed by ``Any``."""
    bad = [
        f"{p.relative_to(SRC).as_posix()}: {seam}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for seam in untyped_seams(p)
    ]
    assert bad == [], "seam parameters typed Any or untyped:\n  " + "\n  ".join(bad)
