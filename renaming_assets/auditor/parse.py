"""Reading a request body back into a graph, with the auditor's own parser."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

ROOTS_LINE = re.compile(r"^Roots: (.+)\.$")
RECORD_LINE = re.compile(r"^(\S+) -> (\S+)$")
WORD = re.compile(r"[A-Za-z0-9]+")
TOKEN = re.compile(r"\w+|[^\w\s]")


class AuditError(ValueError):
    """A body the auditor cannot read; the message names the body."""


@dataclass(frozen=True)
class State:
    roots: tuple[str, ...]
    records: tuple[tuple[str, str], ...]  # (child, parent) in record order
    text: str

    @property
    def parent(self) -> dict[str, str]:
        return dict(self.records)

    def role_counts(self) -> Counter:
        """identifier -> (child-record mentions, parent-record mentions)."""
        child = Counter(c for c, _ in self.records)
        parent = Counter(p for _, p in self.records)
        names = set(self.roots) | set(child) | set(parent)
        return Counter({n: (child[n], parent[n]) for n in names})


def parse_state(text: str, where: str) -> State:
    lines = text.split("\n")
    if lines[-1] != "":
        raise AuditError(f"{where}: state does not end with a newline")
    lines = lines[:-1]
    roots_at = [i for i, line in enumerate(lines) if line.startswith("Roots: ")]
    if len(roots_at) != 1:
        raise AuditError(f"{where}: expected one 'Roots:' line, found {len(roots_at)}")
    match = ROOTS_LINE.match(lines[roots_at[0]])
    if not match:
        raise AuditError(f"{where}: malformed roots line {lines[roots_at[0]]!r}")
    roots = tuple(match.group(1).split(", "))
    records = []
    for line in lines[roots_at[0] + 1:]:
        m = RECORD_LINE.match(line)
        if not m:
            raise AuditError(f"{where}: malformed record line {line!r}")
        records.append((m.group(1), m.group(2)))
    return State(roots, tuple(records), text)


def mentioned(text: str, names: set[str]) -> list[str]:
    """Identifiers (words that are node names) in a text, in order."""
    return [w for w in WORD.findall(text) if w in names]


def tokens(text: str) -> Counter:
    """The word/punctuation multiset."""
    return Counter(TOKEN.findall(text))
