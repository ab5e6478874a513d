"""Marked rooted-tree signatures and the exact oracle, on the parsed graph.

Protocol: "For each task, all four candidates are in one automorphism orbit of the
directed rooted forest when the query marking and literal names are ignored. The
independent auditor proves this using marked rooted-tree signatures."

Two nodes u, v of a rooted forest lie in one automorphism orbit exactly when the forest
with u marked is isomorphic to the forest with v marked. Canonical (AHU) codes decide
rooted-tree isomorphism with node labels exactly: a node's code is its mark plus the
sorted multiset of its children's codes, and a forest's code is the sorted multiset of
its trees' codes. So equal marked-forest codes for the four candidates prove one orbit.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Graph:
    roots: tuple[str, ...]
    parent: dict[str, str]
    children: dict[str, list[str]]
    depth: dict[str, int]

    @property
    def nodes(self) -> list[str]:
        return [*self.roots, *self.parent]

    def root_of(self, node: str) -> str:
        while node in self.parent:
            node = self.parent[node]
        return node

    def ancestor(self, node: str, distance: int) -> str | None:
        for _ in range(distance):
            node = self.parent.get(node)
            if node is None:
                return None
        return node

    def subtree_size(self, node: str) -> int:
        stack, size = [node], 0
        while stack:
            v = stack.pop()
            size += 1
            stack.extend(self.children[v])
        return size


def build_graph(roots: tuple[str, ...], records: tuple[tuple[str, str], ...], where: str) -> Graph:
    parent: dict[str, str] = {}
    for child, p in records:
        if child in parent:
            raise ValueError(f"{where}: {child!r} has two parent records")
        parent[child] = p
    children: dict[str, list[str]] = defaultdict(list)
    for child, p in parent.items():
        children[p].append(child)
    depth = {r: 0 for r in roots}
    stack = list(roots)
    while stack:
        v = stack.pop()
        for c in children[v]:
            depth[c] = depth[v] + 1
            stack.append(c)
    unreached = [v for v in parent if v not in depth]
    if unreached or any(r in parent for r in roots):
        raise ValueError(f"{where}: records do not form a forest under the declared roots "
                         f"({len(unreached)} unreached nodes)")
    for v in parent:
        children.setdefault(v, [])
    for r in roots:
        children.setdefault(r, [])
    return Graph(tuple(roots), parent, dict(children), depth)


def _postorder(graph: Graph) -> list[str]:
    order, stack = [], [(r, False) for r in reversed(graph.roots)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        stack.append((v, True))
        stack.extend((c, False) for c in graph.children[v])
    return order


def marked_forest_codes(graph: Graph, marked: list[str]) -> list[tuple[int, ...]]:
    """The canonical code of the forest with each node of ``marked`` marked in turn (names
    ignored). Codes are interned per call, so they compare only within one call."""
    table: dict[tuple, int] = {}
    code: dict[str, int] = {}
    for v in _postorder(graph):
        code[v] = table.setdefault((0, tuple(sorted(code[c] for c in graph.children[v]))), len(table))
    out = []
    for m in marked:
        changed = {m: table.setdefault((1, tuple(sorted(code[c] for c in graph.children[m]))), len(table))}
        v = m
        while v in graph.parent:
            p = graph.parent[v]
            kids = sorted(changed.get(c, code[c]) for c in graph.children[p])
            changed[p] = table.setdefault((0, tuple(kids)), len(table))
            v = p
        out.append(tuple(sorted(changed.get(r, code[r]) for r in graph.roots)))
    return out


def topology_digest(graph: Graph) -> str:
    """SHA-256 of the unlabeled forest's canonical parenthesis string (comparable across
    worlds, for the collision report)."""
    text: dict[str, str] = {}
    for v in _postorder(graph):
        text[v] = "(" + "".join(sorted(text[c] for c in graph.children[v])) + ")"
    return hashlib.sha256("".join(sorted(text[r] for r in graph.roots)).encode()).hexdigest()


def oracle(graph: Graph, task: str, target: str, ancestor_distance: int) -> str | None:
    """The exact answer of a task for a target, computed on the parsed graph."""
    if task == "root":
        return graph.root_of(target)
    if task == "fourth_ancestor":
        return graph.ancestor(target, ancestor_distance)
    if task == "parent":
        return graph.parent.get(target)
    raise ValueError(f"unknown task {task!r}")
