"""The architecture as rules over the source (docs/design.md §1), checked on the import graph of evotrainer.*.

The graph is computed with ``ast`` from the files that pyproject.toml's ``package-dir`` maps into the one
``evotrainer`` namespace (``servers/`` is ``evotrainer.servers``, ...); nothing is imported or run.

- No import cycle: no strongly connected component of more than one module. Every import counts (at
  module level or inside a function) except those under ``if TYPE_CHECKING:``, which never run.
- Layers, top to bottom: the CLI edge (every module named ``cli``), agents, servers, harness,
  {rl_backend, skills_db}, core (the modules of ``evotrainer/`` that are in no mapped subpackage, and
  core's own subpackages such as ``evotrainer/sandbox/``). An import points to its own layer or lower,
  ``if TYPE_CHECKING:`` imports included. Named exceptions: harness uses only rl_backend's pure maths
  (:data:`HARNESS_USES_FROM_RL_BACKEND`); rl_backend and skills_db do not import each other; the data
  package ``evotrainer.sandbox_images`` may be imported by anyone.
- No function-level import of our own modules or of the standard library outside the CLI edge (CLI
  modules keep theirs for a fast ``--help``; heavy third-party packages may stay lazy anywhere).
- No ``# noqa: E402`` (bottom-of-file imports that hold a cycle together).
- Product code cites docs/design.md (by an existing section) or nothing: no DESIGN.md, no "issue N".
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
CORE = "evotrainer"

# Layers, top to bottom (docs/design.md §1): an import may point to its own layer or lower.
LAYER_RANK = {"cli": 5, "agents": 4, "servers": 3, "harness": 2, "rl_backend": 1, "skills_db": 1, "core": 0, "data": 0}
# The mapped subpackages and their layers; every other evotrainer.* module is core.
SUBPACKAGE_LAYER = {
    "evotrainer.agents": "agents",
    "evotrainer.servers": "servers",
    "evotrainer.harness": "harness",
    "evotrainer.rl_backend": "rl_backend",
    "evotrainer.skills_db": "skills_db",
    "evotrainer.sandbox_images": "data",  # Dockerfiles and the files baked into the images: anyone may read it
}
# The one sideways edge: the harness scores, verifies and splits exactly as the trainer does (GRPO maths,
# reward functions, task generators and their verifiers), so it uses these rl_backend modules instead of a
# second copy. They hold no torch model code; nothing else of rl_backend is the harness's to import.
HARNESS_USES_FROM_RL_BACKEND = frozenset({
    "evotrainer.rl_backend.grpo",
    "evotrainer.rl_backend.rewards",
    "evotrainer.rl_backend.tasks",
    "evotrainer.rl_backend.code_tasks",
    "evotrainer.rl_backend.math_verify_utils",
    # the SWE task family's loader and pytest runner (tasks.load_swe_problems reads it); no model code, no torch
    "evotrainer.rl_backend.swe.tasks",
})
# Layers of one rank that must not import each other.
SEPARATE_LAYERS = (frozenset({"rl_backend", "skills_db"}),)

NOQA_E402 = re.compile(r"#\s*noqa\b[^\n]*\bE402\b")
UNCITABLE = re.compile(r"DESIGN\.md|\b[Ii]ssue\s+#?\d+")  # docs/design.md is the one design page
DESIGN_CITATION = re.compile(r"docs/design\.md(?:\s*§\s*(\d+))?")


@dataclass(frozen=True)
class Import:
    """One import statement of ``module`` that names the evotrainer.* modules ``targets``."""

    module: str
    path: Path
    line: int
    text: str
    targets: tuple[str, ...]  # the modules named (``from P import n``: P.n where that is a module, else P)
    parents: tuple[str, ...]  # ``from P import n`` also runs P: P, where it is a module (cycles only)
    in_function: bool
    type_checking: bool
    own_or_stdlib: bool  # names one of our modules (absolute or relative) or a standard-library module


@dataclass
class Graph:
    modules: dict[str, Path]
    imports: list[Import]

    def edges(self, *, type_checking: bool) -> dict[str, dict[str, Import]]:
        """module -> {imported module -> the first import naming it}; ``type_checking``: include those."""
        out: dict[str, dict[str, Import]] = {m: {} for m in self.modules}
        for imp in self.imports:
            if imp.type_checking and not type_checking:
                continue
            for t in (*imp.targets, *imp.parents):
                if t != imp.module:
                    out[imp.module].setdefault(t, imp)
        return out


def package_dirs(root: Path) -> dict[str, Path]:
    """pyproject's ``package-dir``: import name -> folder."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    return {name: root / folder for name, folder in conf["tool"]["setuptools"]["package-dir"].items()}


def product_files(root: Path) -> list[Path]:
    """Every .py file of the distribution (the folders pyproject maps into the namespace)."""
    return sorted({p for folder in package_dirs(root).values() for p in folder.rglob("*.py")
                   if "__pycache__" not in p.parts})


def modules(root: Path) -> dict[str, Path]:
    """Importable module name -> file (a file under a folder whose name is no identifier is data, not code)."""
    out: dict[str, Path] = {}
    for pkg, folder in package_dirs(root).items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts or not all(p.isidentifier() for p in parts):
                continue
            out[".".join((pkg, *parts[:-1])) if parts[-1] == "__init__" else ".".join((pkg, *parts))] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
    """Import statements with their context: inside a function? under ``if TYPE_CHECKING:``?"""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
        self._functions = 0
        self._type_checking = 0

    def _function(self, node: ast.AST) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._type_checking += 1
        for child in node.body:
            self.visit(child)
        self._type_checking -= 1
        for child in node.orelse:
            self.visit(child)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._functions > 0, self._type_checking > 0))

    visit_Import = visit_ImportFrom = _import

    def visit_Call(self, node: ast.Call) -> None:
        """``lazy_module("x")`` (evotrainer/lazy.py) is an import of ``x`` whose execution is deferred: it
        counts as ``import x`` where it stands (layers, cycles, the function-level rule)."""
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if (name == "lazy_module" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            imp = ast.Import(names=[ast.alias(name=node.args[0].value)])
            ast.copy_location(imp, node)
            self._import(imp)
        self.generic_visit(node)


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The module ``name`` lives in: itself, or the nearest enclosing module (a name defined in it)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def scan(root: Path) -> Graph:
    mods = modules(root)
    imports: list[Import] = []
    for module, path in sorted(mods.items()):
        source = path.read_text()
        lines = source.splitlines()
        collector = _ImportCollector()
        collector.visit(ast.parse(source, filename=str(path)))
        for node, in_function, type_checking in collector.found:
            targets: list[str] = []
            parents: list[str] = []
            if isinstance(node, ast.Import):
                tops = {a.name.partition(".")[0] for a in node.names}
                targets = [r for a in node.names if (r := _resolve(a.name, mods))]
            else:
                base = node.module or ""
                if node.level:
                    parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                tops = {CORE if node.level else base.partition(".")[0]}
                for a in node.names:
                    r = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else _resolve(base, mods)
                    if r:
                        targets.append(r)
                if base in mods and base not in targets:
                    parents.append(base)
            imports.append(Import(
                module=module, path=path, line=node.lineno, text=lines[node.lineno - 1].strip(),
                targets=tuple(dict.fromkeys(t for t in targets if t.startswith(CORE))),
                parents=tuple(parents), in_function=in_function, type_checking=type_checking,
                own_or_stdlib=any(t == CORE or t in sys.stdlib_module_names for t in tops)))
    return Graph(mods, imports)


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(out)


def is_cli_edge(module: str) -> bool:
    return module.rpartition(".")[2] == "cli"


def layer(module: str) -> str:
    if is_cli_edge(module):
        return "cli"
    for prefix, name in SUBPACKAGE_LAYER.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "core"


def _in(module: str, allowed: frozenset[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def layer_violation(src: str, dst: str) -> str | None:
    """Why ``src`` may not import ``dst``, or None when it may."""
    ls, ld = layer(src), layer(dst)
    if ls == "cli" or ld == "data":
        return None
    if LAYER_RANK[ld] > LAYER_RANK[ls]:
        return f"{ls} imports {ld}, a layer above it"
    if frozenset({ls, ld}) in SEPARATE_LAYERS:
        return f"{ls} and {ld} do not import each other"
    if ls == "harness" and ld == "rl_backend" and not _in(dst, HARNESS_USES_FROM_RL_BACKEND):
        return "harness uses only rl_backend's pure maths (HARNESS_USES_FROM_RL_BACKEND)"
    return None


def _where(root: Path, imp: Import) -> str:
    return f"{imp.path.relative_to(root)}:{imp.line}: {imp.text}"


def cycle_report(root: Path, g: Graph) -> list[str]:
    edges = g.edges(type_checking=False)
    out = []
    for comp in strongly_connected(edges):
        inside = set(comp)
        out.append(f"cycle of {len(comp)}: {' '.join(comp)}")
        out += [f"    {m} -> {t}  ({_where(root, imp)})"
                for m in comp for t, imp in sorted(edges[m].items()) if t in inside]
    return out


def layer_report(root: Path, g: Graph) -> list[str]:
    out = []
    for imp in g.imports:
        for t in imp.targets:
            why = layer_violation(imp.module, t)
            if why:
                out.append(f"{_where(root, imp)}  [{imp.module} -> {t}: {why}]")
    return out


def pure_maths_report(root: Path, g: Graph) -> list[str]:
    """What the harness reaches through HARNESS_USES_FROM_RL_BACKEND (and rl_backend's __init__, which
    every one of them runs) must stay inside that set, core and data."""
    edges = g.edges(type_checking=False)
    start = sorted({m for m in g.modules if _in(m, HARNESS_USES_FROM_RL_BACKEND)} | {"evotrainer.rl_backend"})
    seen = set(start)
    todo = list(start)
    out = []
    while todo:
        m = todo.pop()
        for t, imp in sorted(edges[m].items()):
            if layer(t) != "rl_backend" or t in seen:  # other layers: test_imports_respect_the_layers
                continue
            if not _in(t, HARNESS_USES_FROM_RL_BACKEND) and t != "evotrainer.rl_backend":
                out.append(f"{_where(root, imp)}  [{m} -> {t}: the harness would reach it]")
            seen.add(t)
            todo.append(t)
    return sorted(out)


def function_import_report(root: Path, g: Graph) -> list[str]:
    return [_where(root, imp) for imp in g.imports
            if imp.in_function and imp.own_or_stdlib and not is_cli_edge(imp.module)]


def _grep(root: Path, pattern: re.Pattern[str]) -> list[str]:
    out = []
    for path in product_files(root):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                out.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return out


def _design_sections(root: Path) -> set[str]:
    return set(re.findall(r"^##\s+(\d+)\.", (root / "docs" / "design.md").read_text(), re.M))


def design_citation_report(root: Path) -> list[str]:
    sections = _design_sections(root)
    out = []
    for path in product_files(root):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in DESIGN_CITATION.finditer(line):
                if m.group(1) and m.group(1) not in sections:
                    out.append(f"{path.relative_to(root)}:{n}: §{m.group(1)} is no section of docs/design.md")
    return out


def _per_package(found: list[str]) -> str:
    counts = Counter(f.split("/")[0] if "/" in f.split(":")[0] else "." for f in found)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))


def _fail(what: str, found: list[str]) -> None:
    if found:
        pytest.fail(f"{len(found)} {what} ({_per_package(found)}):\n" + "\n".join(found), pytrace=False)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return scan(ROOT)


# --- the rules, on this repository ------------------------------------------------------------------------------
def test_no_import_cycles(graph):
    found = cycle_report(ROOT, graph)
    if found:
        n = sum(1 for f in found if f.startswith("cycle"))
        pytest.fail(f"{n} import cycles (TYPE_CHECKING imports excluded):\n" + "\n".join(found), pytrace=False)


def test_imports_respect_the_layers(graph):
    _fail("imports against the layers (docs/design.md §1)", layer_report(ROOT, graph))


def test_harness_reaches_only_rl_backends_pure_maths(graph):
    _fail("rl_backend modules the harness reaches through its pure-maths imports", pure_maths_report(ROOT, graph))


def test_no_function_level_imports_of_our_modules_or_the_stdlib_outside_the_cli_edge(graph):
    _fail("function-level imports of evotrainer.* or the standard library outside the CLI edge",
          function_import_report(ROOT, graph))


def test_no_noqa_e402():
    _fail("'# noqa: E402' (imports below the top of the module)", _grep(ROOT, NOQA_E402))


def test_product_code_cites_no_design_md_outside_docs_nor_issue_numbers():
    _fail("citations of a DESIGN.md or of an issue number (cite docs/design.md §N or nothing)",
          _grep(ROOT, UNCITABLE))


def test_design_md_citations_name_existing_sections():
    _fail("citations of docs/design.md sections that do not exist", design_citation_report(ROOT))


# --- the checker itself, on a small made-up repository ------------------------------------------------------------
def _fake_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "evotrainer" = "evotrainer", "evotrainer.harness" = "harness", '
        '"evotrainer.rl_backend" = "rl_backend", "evotrainer.skills_db" = "skills_db" }\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# design\n\n## 1. Layers\n\n## 2. Flow\n")
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in ("evotrainer", "harness", "rl_backend", "skills_db"):
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / "__init__.py").touch()
    return tmp_path


def test_checker_finds_cycles_but_not_through_type_checking_imports(tmp_path):
    root = _fake_repo(tmp_path, {
        "evotrainer/a.py": "from evotrainer.b import x\n",
        "evotrainer/b.py": "def f():\n    from evotrainer import a\n",  # a function-level import ties them too
        "evotrainer/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evotrainer.d import y\n",
        "evotrainer/d.py": "from . import c\n",
    })
    found = cycle_report(root, scan(root))
    assert found[0] == "cycle of 2: evotrainer.a evotrainer.b"
    assert not any("evotrainer.c" in f for f in found)


def test_checker_layers_exceptions_and_cli_edge(tmp_path):
    root = _fake_repo(tmp_path, {
        "evotrainer/recipe.py": "from evotrainer.harness import gate\n",  # core -> harness: up
        "evotrainer/lineage.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from evotrainer.harness.gate import Gate\n",  # annotations obey layers too
        "evotrainer/cli.py": "from evotrainer.harness import gate\n",  # the CLI edge imports anything
        "harness/gate.py": "from evotrainer.rl_backend import grpo, local\nfrom evotrainer.recipe import R\n",
        "rl_backend/grpo.py": "import evotrainer.rl_backend.local\n",  # the harness would reach local
        "rl_backend/local.py": "from evotrainer.skills_db.store import S\n",  # rl_backend -> skills_db
        "skills_db/store.py": "from evotrainer.cli import app\n",  # nobody but the CLI edge imports a cli
    })
    g = scan(root)
    found = layer_report(root, g)
    assert [f.rpartition("[")[2] for f in found] == [
        "evotrainer.harness.gate -> evotrainer.rl_backend.local: harness uses only rl_backend's pure maths "
        "(HARNESS_USES_FROM_RL_BACKEND)]",
        "evotrainer.lineage -> evotrainer.harness.gate: core imports harness, a layer above it]",
        "evotrainer.recipe -> evotrainer.harness.gate: core imports harness, a layer above it]",
        "evotrainer.rl_backend.local -> evotrainer.skills_db.store: rl_backend and skills_db do not import each other]",
        "evotrainer.skills_db.store -> evotrainer.cli: skills_db imports cli, a layer above it]",
    ]
    assert pure_maths_report(root, g) == [
        "rl_backend/grpo.py:1: import evotrainer.rl_backend.local  "
        "[evotrainer.rl_backend.grpo -> evotrainer.rl_backend.local: the harness would reach it]"]


def test_checker_function_imports_noqa_and_citations(tmp_path):
    root = _fake_repo(tmp_path, {
        "evotrainer/a.py": '"""See DESIGN.md §2.\nIssue 12 said so.\ndocs/design.md §2 and docs/design.md §9 say more."""\n'
                           "import os  # noqa: E402\n"
                           "def f():\n    import json\n    import torch\n    from . import b\n",
        "evotrainer/b.py": "",
        "evotrainer/cli.py": "def main():\n    import json\n    from evotrainer import a\n",
    })
    assert function_import_report(root, scan(root)) == ["evotrainer/a.py:6: import json",
                                                        "evotrainer/a.py:8: from . import b"]
    assert _grep(root, NOQA_E402) == ["evotrainer/a.py:4: import os  # noqa: E402"]
    assert [f.partition(": ")[0] for f in _grep(root, UNCITABLE)] == ["evotrainer/a.py:1", "evotrainer/a.py:2"]
    assert design_citation_report(root) == ["evotrainer/a.py:3: §9 is no section of docs/design.md"]


def test_checker_counts_lazy_module_calls_as_imports(tmp_path):
    # evotrainer/lazy.py defers a module's import to first use; for these rules it is an import where it stands
    root = _fake_repo(tmp_path, {
        "evotrainer/a.py": "from evotrainer.lazy import lazy_module\nb = lazy_module('evotrainer.b')\n",
        "evotrainer/b.py": "from evotrainer import a\n",  # a cycle through the lazy edge
        "evotrainer/lazy.py": "def lazy_module(name):\n    return name\n",
        "evotrainer/c.py": "from evotrainer.lazy import lazy_module\nh = lazy_module('evotrainer.harness.gate')\n"
                           "def f():\n    return lazy_module('evotrainer.b')\n",
        "harness/gate.py": "",
    })
    g = scan(root)
    assert "cycle of 2: evotrainer.a evotrainer.b" in cycle_report(root, g)
    assert any("evotrainer.c -> evotrainer.harness.gate: core imports harness" in f for f in layer_report(root, g))
    assert function_import_report(root, g) == ["evotrainer/c.py:4: return lazy_module('evotrainer.b')"]
    # the real tree: the backend registry's lazy edges are seen
    real = scan(ROOT).edges(type_checking=False)
    assert "evotrainer.rl_backend.local" in real["evotrainer.rl_backend.backends"]
