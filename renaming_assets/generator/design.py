"""Worlds with their tasks, balanced factors and names (protocol, "Cohort and tasks").

"Target root and target branch, gold answer-key position, candidate lexical rank, and root
declaration position use separate, independently seeded balanced four-cycles within each
family. Name assignment is consequently conditioned on these constraints, not iid over
structural roles."
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from renaming_assets.generator.forest import Forest, clone_forest, grow_branch
from renaming_assets.settings import TASKS, Settings, stream


def factor_names() -> tuple[str, ...]:
    """The balanced factors of one family; key position and lexical rank are per task."""
    return ("target_root", "target_branch", "root_declaration_position",
            *(f"key_position:{t}" for t in TASKS), *(f"lexical_rank:{t}" for t in TASKS))


def balanced_four_cycle(rng: random.Random, worlds: int, size: int) -> tuple[int, ...]:
    """Every run of ``size`` consecutive worlds takes each value once, in an order drawn
    uniformly per run: balanced within the family, and not locked in phase with any other
    factor (each factor has its own seed)."""
    if worlds % size:
        raise ValueError(f"worlds_per_family={worlds} must be a multiple of {size} for balanced four-cycles")
    values: list[int] = []
    for _ in range(worlds // size):
        run = list(range(size))
        rng.shuffle(run)
        values.extend(run)
    return tuple(values)


def family_factors(family: str, settings: Settings) -> dict[str, tuple[int, ...]]:
    c = settings.cohort
    return {name: balanced_four_cycle(stream(settings.seeds.study, "cycle", family, name),
                                      c.worlds_per_family, c.alternatives)
            for name in factor_names()}


@dataclass(frozen=True)
class Task:
    """One question: its candidates in answer-key order and the gold's key index."""

    name: str
    candidates: tuple[int, ...]
    gold_index: int

    @property
    def gold(self) -> int:
        return self.candidates[self.gold_index]


@dataclass(frozen=True)
class World:
    id: str
    family: str
    index: int
    forest: Forest
    names: tuple[str, ...]
    target: int
    root_declaration: tuple[int, ...]
    tasks: dict[str, Task]
    factors: dict[str, int]


def _name_pool(rng: random.Random, count: int, settings: Settings) -> list[str]:
    alphabet, length = settings.naming.alphabet, settings.naming.length
    codes = rng.sample(range(len(alphabet) ** length), count)
    names = []
    for code in codes:
        chars = []
        for _ in range(length):
            code, digit = divmod(code, len(alphabet))
            chars.append(alphabet[digit])
        names.append("".join(chars))
    return names


def _candidate_sets(forest: Forest, target_root: int, settings: Settings) -> dict[str, tuple[int, ...]]:
    """Root queries use all four roots; fourth-ancestor and immediate-parent questions use
    the corresponding spine nodes of the four branches of the target's root."""
    c = settings.cohort
    leaf = c.spine_edges - 1
    ancestor = leaf - c.ancestor_distance
    branches = range(c.branches_per_root)
    return {
        "root": forest.roots,
        "fourth_ancestor": tuple(forest.node(target_root, b, ancestor) for b in branches),
        "parent": tuple(forest.node(target_root, b, leaf - 1) for b in branches),
    }


def _place(gold: int, others: list[int], position: int) -> tuple[int, ...]:
    order = list(others)
    order.insert(position, gold)
    return tuple(order)


def build_world(family: str, index: int, factors: dict[str, tuple[int, ...]], settings: Settings) -> World:
    """One independently seeded world (its own streams for shape, names and orders)."""
    c = settings.cohort
    seed = settings.seeds.study
    world_id = f"{family}-{index:03d}"
    f = {name: values[index] for name, values in factors.items()}
    branch = grow_branch(family, stream(seed, "world", world_id, "shape"), c)
    forest = clone_forest(branch, c)
    target_root, target_branch = f["target_root"], f["target_branch"]
    target = forest.node(target_root, target_branch, c.spine_edges - 1)
    sets = _candidate_sets(forest, target_root, settings)
    gold = {"root": target_root, "fourth_ancestor": sets["fourth_ancestor"][target_branch],
            "parent": sets["parent"][target_branch]}

    names = _name_pool(stream(seed, "world", world_id, "names"), len(forest.parent), settings)
    for task in sets:
        # The gold takes the name of its registered lexical rank among the four candidate
        # names; the distractors take the other three in a seeded random order.
        pool = sorted(names[v] for v in sets[task])
        gold_name = pool.pop(f[f"lexical_rank:{task}"])
        stream(seed, "world", world_id, "distractor_names", task).shuffle(pool)
        for v, name in zip((v for v in sets[task] if v != gold[task]), pool):
            names[v] = name
        names[gold[task]] = gold_name

    order_rng = stream(seed, "world", world_id, "orders")
    tasks = {}
    for task in sets:
        others = [v for v in sets[task] if v != gold[task]]
        order_rng.shuffle(others)
        position = f[f"key_position:{task}"]
        tasks[task] = Task(task, _place(gold[task], others, position), position)
    other_roots = [r for r in forest.roots if r != target_root]
    order_rng.shuffle(other_roots)
    declaration = _place(target_root, other_roots, f["root_declaration_position"])
    return World(world_id, family, index, forest, tuple(names), target, declaration, tasks, f)


def build_family(family: str, settings: Settings) -> list[World]:
    factors = family_factors(family, settings)
    return [build_world(family, i, factors, settings) for i in range(settings.cohort.worlds_per_family)]
