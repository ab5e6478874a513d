"""The planned jobs (``plan.jsonl`` rows): 6,912 distinct bodies, each scheduled twice."""

from __future__ import annotations

from renaming_assets.generator.design import build_family
from renaming_assets.generator.requests import canonical_json, record_orders, render_body, sha256_text
from renaming_assets.generator.schedule import dispatch
from renaming_assets.generator.treatments import draw_treatments
from renaming_assets.settings import FAMILIES, LAYOUTS, NAMINGS, TASKS, Settings


def body_id(world: str, layout: str, task: str, naming: str) -> str:
    return f"{world}:{layout}:{task}:{naming}"


def family_plan(family: str, settings: Settings) -> dict[str, dict]:
    """body id -> {body, body_sha256, expected, metadata, ...} for one topology family."""
    keys = list(settings.cohort.keys)
    out: dict[str, dict] = {}
    for world in build_family(family, settings):
        treatments = draw_treatments(world, settings)
        orders = record_orders(world, settings)
        for layout in LAYOUTS:
            for task in TASKS:
                question = world.tasks[task]
                for naming in NAMINGS:
                    body = render_body(world, task, orders[layout], treatments.maps[naming], settings)
                    bid = body_id(world.id, layout, task, naming)
                    out[bid] = {
                        "world": world.id, "family": family, "layout": layout, "task": task, "naming": naming,
                        "body": body,
                        "body_sha256": sha256_text(canonical_json(body)),
                        "expected": {"gold": keys[question.gold_index], "keys": keys},
                        "metadata": {
                            "study": settings.study,
                            "body_id": bid,
                            "world_index": world.index,
                            "target_root": world.factors["target_root"],
                            "target_branch": world.factors["target_branch"],
                            "root_declaration_position": world.factors["root_declaration_position"],
                            "gold_key_position": question.gold_index,
                            "gold_lexical_rank": world.factors[f"lexical_rank:{task}"],
                            "anchored_identifiers": len(treatments.anchored),
                            "eligible_identifiers": len(treatments.eligible),
                        },
                    }
    return out


def assemble_plan(bodies: dict[str, dict], settings: Settings) -> list[dict]:
    """Planned jobs in dispatch order; ``bodies`` is the union of every family's plan."""
    worlds = sorted({b["world"] for b in bodies.values()})
    rows = []
    for slot in dispatch(worlds, settings):
        b = bodies[body_id(slot.world, slot.layout, slot.task, slot.naming)]
        rows.append({
            "job": f"{b['metadata']['body_id']}:copy{slot.copy}",
            "world": slot.world, "family": b["family"], "layout": slot.layout, "task": slot.task,
            "naming": slot.naming, "copy": slot.copy, "block_position": slot.block_position,
            "dispatch_index": slot.dispatch_index,
            "body": b["body"], "body_sha256": b["body_sha256"], "expected": b["expected"],
            "metadata": b["metadata"],
        })
    return rows


def generate_plan(settings: Settings) -> list[dict]:
    bodies: dict[str, dict] = {}
    for family in FAMILIES:
        bodies.update(family_plan(family, settings))
    return assemble_plan(bodies, settings)
