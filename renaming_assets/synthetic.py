"""SYNTHETIC RESPONDER, for tests and the demo only. Not a model, not evidence.

Writes one log row per planned job, each with ``synthetic: true``, in the log-row format
the analyzer reads. Selections come from seeded categorical distributions
(``SETTINGS.synthetic``, seed ``SETTINGS.seeds.synthetic``) in which renaming lowers the
gold probability and moves mass to a body-specific wrong key, so the analysis has
something to estimate. ``faults`` injects failed responses for tests.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from renaming_assets.settings import SETTINGS, Settings, stream


def _distribution(row: dict, settings: Settings) -> list[float]:
    syn = settings.synthetic
    keys = row["expected"]["keys"]
    offset = (2 * stream(settings.seeds.synthetic, "world", row["world"]).random() - 1) * syn.world_offset
    gold = dict(syn.gold_probability)[row["task"]] + offset - dict(syn.naming_shift)[row["naming"]]
    gold = min(1.0, max(0.0, gold))
    wrong = [k for k in keys if k != row["expected"]["gold"]]
    favoured = stream(settings.seeds.synthetic, "favoured", row["metadata"]["body_id"]).choice(wrong)
    rest = (1 - gold) * (1 - syn.favoured_wrong_share) / (len(wrong) - 1)
    return [gold if k == row["expected"]["gold"] else
            (1 - gold) * syn.favoured_wrong_share if k == favoured else rest for k in keys]


def respond(row: dict, settings: Settings = SETTINGS, fault: str | None = None) -> dict:
    """One synthetic log row for a planned job; ``fault`` names a failure to inject."""
    syn = settings.synthetic
    keys = row["expected"]["keys"]
    rng = stream(settings.seeds.synthetic, "job", row["job"])
    probs = _distribution(row, settings)
    selected = rng.choices(keys, weights=probs)[0]
    cents = [round(p, 2) for p in probs]  # printed like a service that rounds to cents
    response = {
        "http_status": 200, "error": None, "validated_success": True, "model": settings.request.model,
        "answer_type": settings.request.answer_type, "selected": selected,
        "probabilities": dict(zip(keys, cents)),
        "confidence": cents[keys.index(selected)],
        "usage": {"input_tokens": len(row["body"]["state"]) // 4, "output_tokens": 1},
    }
    if fault == "http_500":
        response.update(http_status=500, error="internal error", validated_success=False, selected=None)
    elif fault == "bad_probabilities":
        response["probabilities"] = {keys[0]: 0.5}
    elif fault == "unvalidated":
        response["validated_success"] = False
    elif fault is not None:
        raise ValueError(f"unknown synthetic fault {fault!r}")
    started = datetime.fromisoformat(syn.start) + timedelta(seconds=row["dispatch_index"] * syn.seconds_between_requests)
    return {
        "job": row["job"], "body_sha256": row["body_sha256"], "body": row["body"], "expected": row["expected"],
        "metadata": row["metadata"], "synthetic": True, "started_at": started.isoformat(),
        "duration_s": round(0.5 + rng.random(), 3), "response": response,
    }


def write_synthetic_log(plan_path: Path, out: Path, settings: Settings = SETTINGS,
                        faults: dict[str, str] | None = None) -> Path:
    """Answer every planned job of ``plan_path`` synthetically into the JSON-lines ``out``."""
    faults = faults or {}
    with open(plan_path, encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for line in src:
            row = json.loads(line)
            dst.write(json.dumps(respond(row, settings, faults.get(row["job"])), separators=(",", ":")) + "\n")
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m renaming_assets.synthetic BUNDLE OUT_LOG  (SYNTHETIC responder, tests/demo only)")
    write_synthetic_log(Path(sys.argv[1]) / "plan.jsonl", Path(sys.argv[2]))
