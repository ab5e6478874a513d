"""Request bodies: one single-question Choice request per world/layout/task/naming.

Protocol, "Treatments": "Each task is served as a separate single-question Choice
request, with model pinned to jev-1.13.0." "Two layouts are crossed with naming: an
arbitrary shuffled edge order and a root-grouped order retaining the shuffled relative
order within each group." "Each abstract role receives the literal identifier of its image
under the bijection."
"""

from __future__ import annotations

import hashlib
import json

from renaming_assets.generator.design import World
from renaming_assets.settings import Settings, stream

LEGEND = "Each line 'x -> y' says that y is the parent of x."
QUESTIONS = {
    "root": "Which root is the root of the tree that contains {target}?",
    "fourth_ancestor": "Which node is the fourth ancestor of {target} (the parent of the parent of the parent of its parent)?",
    "parent": "Which node is the immediate parent of {target}?",
}


def canonical_json(obj: object) -> str:
    """The canonical form whose SHA-256 is a body's ``body_sha256``."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_orders(world: World, settings: Settings) -> dict[str, tuple[int, ...]]:
    """Record (non-root node) order per layout: shuffled, and root-grouped in root
    declaration order keeping the shuffled relative order within each group."""
    forest = world.forest
    shuffled = [v for v, p in enumerate(forest.parent) if p is not None]
    stream(settings.seeds.study, "world", world.id, "layout").shuffle(shuffled)
    rank = {root: i for i, root in enumerate(world.root_declaration)}
    grouped = sorted(shuffled, key=lambda v: rank[forest.root_of(v)])  # sorted() is stable
    return {"shuffled": tuple(shuffled), "grouped": tuple(grouped)}


def render_body(world: World, task: str, records: tuple[int, ...], node_map: tuple[int, ...],
                settings: Settings) -> dict:
    """The exact request body; role ``v`` is written with the identifier of ``node_map[v]``."""
    name = [world.names[image] for image in node_map]
    parent = world.forest.parent
    lines = [LEGEND, "Roots: " + ", ".join(name[r] for r in world.root_declaration) + "."]
    lines.extend(f"{name[v]} -> {name[parent[v]]}" for v in records)
    question = world.tasks[task]
    return {
        "model": settings.request.model,
        "type": settings.request.answer_type,
        "state": "\n".join(lines) + "\n",
        "instructions": QUESTIONS[task].format(target=name[world.target]),
        "alternatives": [{"key": key, "text": name[v]}
                         for key, v in zip(settings.cohort.keys, question.candidates)],
    }
