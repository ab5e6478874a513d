"""The user documents stay a guide: the README short, every link and image live, no issue
numbers, and every module they name present in the package.

Fast: files are read as text; the package is never imported (module names are resolved with
``importlib.util.find_spec`` on the parent package only where a dotted name is checked).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target); a target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)
# Module paths in backticks: `fear_assets/x/y.py` (a file) or `fear_assets.x.y` (a module).
FILE_PATH = re.compile(r"`(fear_assets/[\w/]+\.py)`")
DOTTED = re.compile(r"`(fear_assets(?:\.\w+)+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.MULTILINE)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


def test_the_documents_exist():
    names = {p.name for p in DOCUMENTS}
    assert {"README.md", "architecture.md", "protocol-map.md", "operations.md", "power-gate.md",
            "embedded-family.md", "readings.md", "gpu-host.md", "name_gate.md"} <= names


def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_ids(DOCUMENTS))
def test_every_relative_link_and_image_resolves(path):
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved.relative_to(ROOT) if ROOT in resolved.parents else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading with anchor #{anchor} in {resolved.name})")
    assert not broken, f"{path.name}: broken links: {broken}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_ids(DOCUMENTS))
def test_no_issue_numbers_in_user_documents(path):
    found = [m.group(0) for m in ISSUE.finditer(path.read_text(encoding="utf-8"))]
    assert not found, f"{path.name} names issues by number: {found}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_ids(DOCUMENTS))
def test_every_named_module_exists(path):
    text = path.read_text(encoding="utf-8")
    missing = [name for name in FILE_PATH.findall(text) if not (ROOT / name).is_file()]
    for dotted in DOTTED.findall(text):
        if importlib.util.find_spec(dotted) is None:
            missing.append(dotted)
    assert not missing, f"{path.name} names modules that do not exist: {missing}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns themselves: a broken link, a missing anchor, an issue number, a module."""
    doc = tmp_path / "doc.md"
    doc.write_text("# A title\n\n[a](missing.md) [b](#a-title) [c](#nope) issue 24, see #16\n"
                   "`fear_assets/no_such_module.py`\n", encoding="utf-8")
    assert links(doc) == ["missing.md", "#a-title", "#nope"]
    assert anchors(doc) == {"a-title"}
    assert [m.group(0) for m in ISSUE.finditer(doc.read_text())] == ["issue 24", "#16"]
    assert FILE_PATH.findall(doc.read_text()) == ["fear_assets/no_such_module.py"]
    assert slug("The registered code hash and the record's frozen fields") == \
        "the-registered-code-hash-and-the-records-frozen-fields"
