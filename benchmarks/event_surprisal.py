"""Cost of matching the secondary-class events (issue 10, item 8) on the embedded model.

Run (from the repository root; the machine is shared, so at low priority):

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/event_surprisal.py

What it times, side by side in one process on SmolLM2-135M-Instruct (CPU, float32, the
embedded checkpoint the main job loads), with ``fear_assets.pilot.surprisal.sentence_surprisal``
(one prefill of each rotation's system prompt, the sentences batched from its KV cache):

  frames   the embedded design's candidate frames only (what ``sentence_surprisal`` measured
           before events were matched): 6 frames x 3 rotations x (12 agent + 2 partner sentences)
  events   the embedded design's events (2 per class): 4 events x 3 rotations x (2 + 2 partner)
  all 40   every event of the bank (a registered family's design): 40 x 3 x (2 + 2)

Each arm runs ``--repeats`` times (default 1) in turn (frames, events, all 40, frames, ...) so they see
the same load; the fastest repetition of each is reported, with the uptime load beside it.
Writes ``benchmarks/results/event_surprisal.json`` (the Markdown section in RESULTS.md is
written by hand from it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.trials import candidate_frames, registered_selection
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.models import load_model, registry
from fear_assets.pilot.surprisal import sentence_surprisal
from fear_assets.pilot.matching import event_differences, event_verdicts
from fear_assets.core.settings import DEFAULT_CACHE_DIR, load_settings
from fear_assets.stimuli.bank import load_bank

FAMILY = "smollm2-135m"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    settings, bank = load_settings(), load_bank()
    family = settings.family(FAMILY)
    started = time.perf_counter()
    model, tokenizer = load_model(registry(settings, FAMILY)["tested"], DEFAULT_CACHE_DIR, "cpu")
    load_s = time.perf_counter() - started
    # The names do not change the cost (every registered name is two SmolLM2 tokens).
    builder = DocumentBuilder(settings, bank, FAMILY, list(settings.names[: settings.selected_name_count]),
                              {"tested": tokenizer})
    selection = registered_selection(settings, bank, family)
    arms = {
        "frames": [bank.item(i) for i in candidate_frames(settings, bank, family)],
        "events": [bank.item(i) for c in settings.bank.event_classes for i in selection.ids(c)],
        "all 40": list(bank.events),
    }
    engine = TeacherForcedEngine(model)
    best: dict[str, float] = {}
    sentences: dict[str, int] = {}
    tables = {}
    for _ in range(args.repeats):
        for arm, items in arms.items():
            t0 = time.perf_counter()
            tables[arm] = sentence_surprisal(engine, tokenizer, builder, items)
            print(f"{arm}: {len(tables[arm])} sentences in {time.perf_counter() - t0:.1f} s", flush=True)
            elapsed = time.perf_counter() - t0
            best[arm] = min(best.get(arm, float("inf")), elapsed)
            sentences[arm] = len(tables[arm])
    # How far SmolLM2 puts the events from the frames (every examined frame as the reference:
    # under SmolLM2 no frame is retained, so the registered reference is empty).
    both = pd.concat([tables["frames"], tables["all 40"]], ignore_index=True)
    verdicts = event_verdicts(event_differences(both, set(tables["frames"]["item_id"]),
                                                settings.bank.event_classes),
                              float(settings.matching.max_abs_difference))
    load = os.getloadavg()
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(), "loadavg_1_5_15": [round(x, 2) for x in load],
        "model_load_s": round(load_s, 1), "repeats": args.repeats,
        "arms": {arm: {"items": len(arms[arm]), "sentences": sentences[arm], "seconds": round(best[arm], 2),
                       "sentences_per_s": round(sentences[arm] / best[arm], 1)} for arm in arms},
        "events_over_frames": round(best["events"] / best["frames"], 3),
        "smollm2_events_vs_frames_mean": {
            "passing": int(verdicts["passes"].sum()), "events": len(verdicts),
            "max_abs_difference_by_class": verdicts.groupby("event_class")["max_abs_difference"]
            .agg(["min", "median", "max"]).round(3).to_dict(orient="index"),
        },
    }
    out = Path(__file__).parent / "results" / "event_surprisal.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
