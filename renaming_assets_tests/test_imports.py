"""The protocol: "All published code is offline and uses the Python standard library";
the auditor "shares no logic with the generator"."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "renaming_assets"
STDLIB_PARTS = ["settings.py", "precision.py", "bundle.py", "analyze.py", "synthetic.py", "demo.py", "__init__.py",
                "generator", "auditor", "analyzer"]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def _files(part: str) -> list[Path]:
    p = PACKAGE / part
    return sorted(p.glob("*.py")) if p.is_dir() else [p]


@pytest.mark.parametrize("part", STDLIB_PARTS)
def test_standard_library_only(part):
    for path in _files(part):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top == "renaming_assets", f"{path.name} imports {name}"
            if top == "renaming_assets":
                assert not name.startswith(("renaming_assets.assets", "renaming_assets.definitions",
                                            "renaming_assets.resources")), f"{path.name} imports {name}"


def test_auditor_shares_no_logic_with_the_generator():
    for path in _files("auditor"):
        for name in _imports(path):
            if name.startswith("renaming_assets"):
                # Only its own modules and the registered numbers.
                assert name.startswith("renaming_assets.auditor") or name == "renaming_assets.settings", \
                    f"auditor/{path.name} imports {name}"


def test_generator_does_not_use_the_auditor_or_analyzer():
    for path in _files("generator"):
        assert not any(n.startswith(("renaming_assets.auditor", "renaming_assets.analyzer")) for n in _imports(path))
