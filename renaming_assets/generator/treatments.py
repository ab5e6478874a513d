"""One preselected map per treatment per world (protocol, "Treatments").

"The union of every identifier in all three tasks' instructions and alternatives,
including all roots, is anchored. Unanchored singleton bins are fixed in both treatments.
The eligible set is exactly the union of nonsingleton bins."
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from renaming_assets.generator.design import World
from renaming_assets.settings import Settings, stream


def mention_bins(world: World, anchored: frozenset[int]) -> dict[tuple[int, int], list[int]]:
    """Unanchored nodes by (child-record mentions, parent-record mentions): one record per
    non-root node, so a node is mentioned once as a child (roots never) and once as a
    parent per child."""
    parent = world.forest.parent
    as_parent = [0] * len(parent)
    for p in parent:
        if p is not None:
            as_parent[p] += 1
    bins: dict[tuple[int, int], list[int]] = defaultdict(list)
    for v, p in enumerate(parent):
        if v not in anchored:
            bins[(0 if p is None else 1, as_parent[v])].append(v)
    return dict(sorted(bins.items()))


def anchored_nodes(world: World) -> frozenset[int]:
    """The target (named in every instruction), all candidates (all roots among them)."""
    nodes = {world.target, *world.forest.roots}
    for task in world.tasks.values():
        nodes.update(task.candidates)
    return frozenset(nodes)


def derangement(items: list[int], rng: random.Random) -> dict[int, int]:
    """A uniformly sampled derangement: uniform permutations, rejected until none is
    fixed ("conditioned on moving every eligible identifier")."""
    if len(items) < 2:
        raise ValueError(f"a derangement needs at least two items, got {len(items)}")
    while True:
        image = list(items)
        rng.shuffle(image)
        if all(a != b for a, b in zip(items, image)):
            return dict(zip(items, image))


@dataclass(frozen=True)
class Treatments:
    """Node maps (``map[v]`` is the node whose literal identifier role ``v`` receives)."""

    anchored: frozenset[int]
    eligible: tuple[int, ...]
    maps: dict[str, tuple[int, ...]]


def draw_treatments(world: World, settings: Settings) -> Treatments:
    anchored = anchored_nodes(world)
    bins = mention_bins(world, anchored)
    nonsingleton = [members for members in bins.values() if len(members) > 1]
    eligible = sorted(v for members in nonsingleton for v in members)
    identity = tuple(range(len(world.forest.parent)))
    unrestricted = list(identity)
    unrestricted_rng = stream(settings.seeds.study, "world", world.id, "unrestricted")
    for v, image in derangement(eligible, unrestricted_rng).items():
        unrestricted[v] = image
    constrained = list(identity)
    constrained_rng = stream(settings.seeds.study, "world", world.id, "constrained")
    for members in nonsingleton:  # bins in sorted key order, so the draw is reproducible
        for v, image in derangement(members, constrained_rng).items():
            constrained[v] = image
    return Treatments(anchored, tuple(eligible),
                      {"original": identity, "unrestricted": tuple(unrestricted), "constrained": tuple(constrained)})
