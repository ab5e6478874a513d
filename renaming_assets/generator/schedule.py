"""Execution order (protocol, "Scheduling").

"Shuffle complete world blocks. Within each world, shuffle the six layout-by-task blocks.
In each block, select uniformly among all 720 permutations of the six naming-by-copy
conditions, including adjacent exact copies. Within each family/layout/task, pairs of
consecutive world indices receive a randomly chosen permutation and its reverse."
"""

from __future__ import annotations

from dataclasses import dataclass

from renaming_assets.settings import FAMILIES, LAYOUTS, NAMINGS, TASKS, Settings, stream


def conditions(settings: Settings) -> tuple[tuple[str, int], ...]:
    return tuple((naming, copy) for naming in NAMINGS for copy in settings.schedule.copies)


@dataclass(frozen=True)
class Slot:
    world: str
    layout: str
    task: str
    naming: str
    copy: int
    block_position: int
    dispatch_index: int


def block_orders(settings: Settings) -> dict[tuple[str, str, str], tuple[tuple[str, int], ...]]:
    """(world, layout, task) -> the six conditions in block order. ``rng.sample`` of all
    six is uniform over the 720 permutations; the next world index gets the reverse, so
    each condition's mean position over the pair, hence the stratum, is exactly 2.5."""
    per_family = settings.cohort.worlds_per_family
    if per_family % 2:
        raise ValueError(f"worlds_per_family={per_family} must be even for mirrored permutation pairs")
    six = conditions(settings)
    orders = {}
    for family in FAMILIES:
        for layout in LAYOUTS:
            for task in TASKS:
                rng = stream(settings.seeds.study, "schedule", family, layout, task)
                for pair in range(per_family // 2):
                    permutation = tuple(rng.sample(six, len(six)))
                    orders[(f"{family}-{2 * pair:03d}", layout, task)] = permutation
                    orders[(f"{family}-{2 * pair + 1:03d}", layout, task)] = permutation[::-1]
    return orders


def dispatch(world_ids: list[str], settings: Settings) -> list[Slot]:
    """Every planned job in dispatch order: worlds shuffled, then each world's six
    layout-by-task blocks shuffled, then the block's condition order."""
    orders = block_orders(settings)
    worlds = sorted(world_ids)
    stream(settings.seeds.study, "dispatch").shuffle(worlds)
    slots: list[Slot] = []
    for world in worlds:
        blocks = [(layout, task) for layout in LAYOUTS for task in TASKS]
        stream(settings.seeds.study, "blocks", world).shuffle(blocks)
        for layout, task in blocks:
            for position, (naming, copy) in enumerate(orders[(world, layout, task)]):
                slots.append(Slot(world, layout, task, naming, copy, position, len(slots)))
    return slots
