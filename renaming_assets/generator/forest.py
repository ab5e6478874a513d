"""Forest worlds: four roots, four cloned branches per root (protocol, "Cohort and tasks").

"Each world contains four roots, four cloned branches per root, and 32 non-root nodes per
branch: 512 non-root nodes and 516 total nodes. The branch has an eight-edge spine and 24
additional nodes." One branch shape is drawn per world and cloned into all sixteen
branches, so the four roots' trees, and the four branches of each root, are isomorphic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from renaming_assets.settings import Cohort

#: Branch-local index of the parent of the first spine node: the root.
ROOT = -1


@dataclass(frozen=True)
class Branch:
    """One branch shape: ``parent[i]`` is the branch-local parent of node ``i``.

    Nodes ``0..spine_edges-1`` are the spine (depths 1..8; node ``spine_edges-1`` is the
    depth-eight spine leaf); the rest are the additional nodes, in attachment order.
    """

    parent: tuple[int, ...]
    depth: tuple[int, ...]


def _spine(cohort: Cohort) -> tuple[list[int], list[int]]:
    parent = [ROOT] + list(range(cohort.spine_edges - 1))
    depth = list(range(1, cohort.spine_edges + 1))
    return parent, depth


def _eligible(depth: list[int], cohort: Cohort) -> list[int]:
    """Recursive law: existing branch nodes whose depth is below eight.

    The root is not eligible: a node attached to it would not belong to the branch.
    """
    return [i for i, d in enumerate(depth) if d < cohort.target_depth]


def grow_branch(law: str, rng: random.Random, cohort: Cohort) -> Branch:
    """Draw one branch under an attachment law, exactly as the protocol lists them:

    1. recursive: uniformly select an eligible existing parent whose depth is below eight.
    2. spine_fan: attach additional nodes to a randomly selected spine position at depth
       one through seven.
    3. clustered: choose three spine hubs, then mix hub attachments with recursive
       offshoots (hub with ``hub_attachment_probability``, else recursive).
    """
    parent, depth = _spine(cohort)
    additional = cohort.nonroot_nodes_per_branch - cohort.spine_edges
    low, high = cohort.fan_depths
    spine_positions = list(range(low - 1, high))  # branch-local indices of depths 1..7
    hubs = sorted(rng.sample(spine_positions, cohort.clustered_hubs)) if law == "clustered" else []
    for _ in range(additional):
        if law == "recursive":
            p = rng.choice(_eligible(depth, cohort))
        elif law == "spine_fan":
            p = rng.choice(spine_positions)
        elif law == "clustered":
            if rng.random() < cohort.hub_attachment_probability:
                p = rng.choice(hubs)
            else:
                p = rng.choice(_eligible(depth, cohort))
        else:
            raise ValueError(f"unknown attachment law {law!r}; expected recursive, spine_fan or clustered")
        parent.append(p)
        depth.append(depth[p] + 1)
    return Branch(parent=tuple(parent), depth=tuple(depth))


@dataclass(frozen=True)
class Forest:
    """A world's abstract forest. Roots are nodes ``0..roots-1``; branch ``(r, b)`` holds
    nodes ``roots + (r*branches_per_root + b)*n + i`` for its branch-local ``i``."""

    parent: tuple[int | None, ...]
    roots: tuple[int, ...]
    branch: Branch
    cohort: Cohort

    def node(self, root: int, branch: int, local: int) -> int:
        c = self.cohort
        return c.roots + (root * c.branches_per_root + branch) * c.nonroot_nodes_per_branch + local

    def root_of(self, node: int) -> int:
        while self.parent[node] is not None:
            node = self.parent[node]
        return node


def clone_forest(branch: Branch, cohort: Cohort) -> Forest:
    """Clone one branch shape under every root (``branches_per_root`` times each)."""
    parent: list[int | None] = [None] * cohort.roots
    for r in range(cohort.roots):
        for b in range(cohort.branches_per_root):
            base = cohort.roots + (r * cohort.branches_per_root + b) * cohort.nonroot_nodes_per_branch
            parent.extend(r if p == ROOT else base + p for p in branch.parent)
    return Forest(parent=tuple(parent), roots=tuple(range(cohort.roots)), branch=branch, cohort=cohort)
