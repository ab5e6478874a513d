"""The code's shape: a protocol core, pure stage packages in one layer order, one Dagster shell.

These tests keep the layout the registered code hash relies on: everything that decides a
document, score, gate, label or reading sits in a hashed stage package, and the only
unhashed package (``defs/``, the Dagster shell) can only wire those packages together.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fear_assets.core.settings import ProtocolSettings
from fear_assets.registration.record import CODE_NOT_HASHED, analysis_code_sha256

PACKAGE = Path(__file__).resolve().parent.parent / "fear_assets"
#: The layer order: a package imports only packages before it (the shell, last, imports any).
LAYERS = ("core", "lm", "stimuli", "design", "models", "pilot", "registration", "collection", "probes", "analysis",
          "reading", "simulation", "report", "rehearsal", "defs")
SHELL = "defs"
#: Rehearsal tooling (random-weight stand-in checkpoints): unhashed like the shell, and a
#: layer of its own just before it, so it may use every stage package but no Dagster.
REHEARSAL = "rehearsal"
#: What the shell may read from the settings object itself; every registered number and rule
#: reaches it through the per-family view (``core.registered``) or a stage function.
SHELL_SETTINGS_ATTRIBUTES = {"family", "families", "sha256", "master_seed", "path"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[tuple[str, ast.AST]]:
    """(imported module, node) for every import statement of ``path``, names of ``from x import
    y`` resolved to the module ``x.y`` where that is a module."""
    modules = _modules()
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node))
            out += [(f"{node.module}.{a.name}", node) for a in node.names if f"{node.module}.{a.name}" in modules]
    return out


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fear_assets" and len(parts) > 1 else None


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"
    top_modules = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py"}
    assert not top_modules, f"modules outside every stage package: {sorted(top_modules)}"


def test_no_package_imports_a_later_layer():
    upward = []
    for module, path in _modules().items():
        source = _package(module)
        if source is None:
            continue
        for imported, node in _imports(path):
            target = _package(imported)
            if target and target != source and LAYERS.index(target) > LAYERS.index(source):
                upward.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {imported}")
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {m: {i for i, _ in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    # Tarjan's strongly connected components; any component of two or more modules is a cycle.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_no_project_import_inside_a_function():
    inner = []
    for path in _modules().values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.startswith("fear_assets") for n in names):
                    inner.append(f"{path.relative_to(PACKAGE)}:{node.lineno} in {fn.name}")
    assert not inner, "\n".join(inner)


def test_only_the_shell_imports_dagster():
    # Statically: no module outside the shell names a Dagster package...
    found = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for module, path in _modules().items()
             if _package(module) != SHELL
             for imported, node in _imports(path) if imported.split(".")[0].startswith("dagster")]
    assert not found, found
    # ...and at run time: importing every stage package loads neither Dagster nor, for the
    # protocol core, torch (the core must load where only the settings are needed).
    stages = [m for m in _modules() if _package(m) not in (None, SHELL)]
    code = ("import importlib, json, sys\n"
            "core = [importlib.import_module(m) for m in %r]\n"
            "torch_after_core = 'torch' in sys.modules\n"
            "[importlib.import_module(m) for m in %r]\n"
            "print(json.dumps({'torch_after_core': torch_after_core, "
            "'dagster': sorted(m for m in sys.modules if m.split('.')[0].startswith('dagster'))}))"
            % ([m for m in stages if _package(m) == "core"], stages))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["dagster"] == [], loaded["dagster"][:5]
    assert loaded["torch_after_core"] is False


def test_loading_the_definitions_imports_no_model_or_statistics_library():
    """Every Dagster process (the UI's code server, each run worker, each step process) loads
    the definitions first; torch, transformers, SciPy's statistics, PyMC and ArviZ load only
    in the steps that use them (on this machine: 9.6-10.7 s to load the definitions, against
    17.8-20.1 s with torch, transformers and scipy.stats at module level)."""
    heavy = ("torch", "transformers", "scipy.stats", "pymc", "arviz", "matplotlib", "statsmodels", "sklearn")
    code = ("import json, sys\nimport fear_assets.defs.definitions\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _settings_receiver(node: ast.AST) -> bool:
    """``settings.x`` or ``<anything>.settings().x``: an expression that is the settings object."""
    if isinstance(node, ast.Name):
        return node.id == "settings"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "settings"
    return False


def test_the_shell_never_reads_a_settings_section():
    # Every public attribute of the settings object other than identity and the family
    # lookup is a registered section or rule: the shell reaches those only through the
    # per-family view or a stage function.
    sections = {name for name in dir(ProtocolSettings) if not name.startswith("_")} | {"raw", "sections"}
    forbidden = sections - SHELL_SETTINGS_ATTRIBUTES
    reads = []
    for module, path in _modules().items():
        if _package(module) != SHELL:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in forbidden and _settings_receiver(node.value):
                reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads settings.{node.attr}")
    assert not reads, "\n".join(reads)


@pytest.mark.parametrize("package", [p for p in LAYERS if p not in CODE_NOT_HASHED and (PACKAGE / p).is_dir()])
def test_the_registered_code_hash_covers_every_stage_package(tmp_path, package):
    root = tmp_path / "fear_assets"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = analysis_code_sha256(root)
    target = sorted((root / package).rglob("*.py"))[-1]
    target.write_text(target.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert analysis_code_sha256(root) != before, f"an edit of {package}/ leaves the registered hash unchanged"


def test_the_shell_and_the_rehearsal_tooling_are_the_only_unhashed_packages(tmp_path):
    assert set(CODE_NOT_HASHED) == {SHELL, REHEARSAL}
    root = tmp_path / "fear_assets"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = analysis_code_sha256(root)
    for target in (root / SHELL / "definitions.py", root / REHEARSAL / "models.py"):
        target.write_text(target.read_text(encoding="utf-8") + "\n# wiring edit\n", encoding="utf-8")
    assert analysis_code_sha256(root) == before
