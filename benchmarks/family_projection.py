"""Projected GPU time and memory of every registered family's scoring, every block, from the
H200 figures ``benchmarks/gpu.py`` measured (``results/gpu.json``) and the registered design.

For each registered (non-embedded) family this counts the documents of every block at every
depth from the registered trial grid (``fear_assets.design.trials.build_grid``: the closed
accounting, pilot blocks included), and gives each document the per-document cost gpu.py
measured at its length (depth + 140 tokens around the distractors, log-log interpolated):
one prefill, the packed pass of the full branch set and its share of batched greedy decoding
of the registered 48 tokens. That is an upper bound for baselines and probe twins (fewer
readouts) and assumes every reader (tested, base, judge) costs what the measured Qwen2.5-7B
architecture costs; the scorer's and the pilot's smaller steps (surprisal, matching,
binding) are not in it.

GPU memory is computed, not measured: the bf16 weights of the largest checkpoint a stage
loads plus the KV cache of one decoding batch at the family's deepest document, from each
architecture's published configuration (layers x key-value heads x head size). Run:

    .venv/bin/python benchmarks/family_projection.py     # writes results/family_projection.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu import interpolate  # noqa: E402

from fear_assets.core.settings import load_settings, REGISTERED_SETTINGS_PATH, DEFAULT_BANK_DIR  # noqa: E402
from fear_assets.design.trials import build_grid  # noqa: E402
from fear_assets.stimuli.bank import load_bank  # noqa: E402

OVERHEAD_TOKENS = 140
#: Published configurations (config.json on the hub): parameters, layers, key-value heads,
#: head size. Only the memory estimate uses them.
ARCHITECTURES = {
    "Qwen/Qwen2.5-7B-Instruct": (7.62e9, 28, 4, 128), "Qwen/Qwen2.5-7B": (7.62e9, 28, 4, 128),
    "meta-llama/Llama-3.1-8B-Instruct": (8.03e9, 32, 8, 128), "meta-llama/Llama-3.1-8B": (8.03e9, 32, 8, 128),
    "google/gemma-2-9b-it": (9.24e9, 42, 8, 256), "google/gemma-2-9b": (9.24e9, 42, 8, 256),
    "mistralai/Mistral-7B-Instruct-v0.3": (7.25e9, 32, 8, 128),
}
GIB = 2 ** 30


def memory_gib(checkpoint: str, tokens: int, batch: int) -> dict:
    params, layers, kv_heads, head = ARCHITECTURES[checkpoint]
    weights = params * 2
    kv = layers * kv_heads * head * 2 * 2 * tokens * batch  # K and V, bf16, a decoding batch
    return {"weights_gib": round(weights / GIB, 1), "kv_cache_gib": round(kv / GIB, 1),
            "total_gib": round((weights + kv) / GIB, 1)}


def main() -> int:
    gpu = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())["gpu"]
    rows, batch, max_new = gpu["lengths"], gpu["generation_batch"], gpu["projection"]["max_new_tokens"]

    def per_document(tokens: int) -> float:
        return (interpolate([(r["tokens"], r["prefill_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["packed_pass_s"]) for r in rows], tokens)
                + interpolate([(r["tokens"], r["decode_step_s"]) for r in rows], tokens) * max_new / batch)

    settings = load_settings(REGISTERED_SETTINGS_PATH)
    bank = load_bank(DEFAULT_BANK_DIR, settings)
    out = {"source": {"gpu_json_date": gpu["date"], "device": gpu["device"], "dtype": gpu["dtype"],
                      "generation_batch": batch, "max_new_tokens": max_new, "overhead_tokens": OVERHEAD_TOKENS},
           "families": {}}
    for key, family in settings.families.items():
        if family.role == "embedded":
            continue
        grid = build_grid(settings, bank, key)
        readers = {b.name: b.reader for b in settings.blocks}
        counts = grid.groupby(["block", "depth_tokens"]).size().reset_index(name="documents")
        counts["seconds"] = [n * per_document(int(d) + OVERHEAD_TOKENS) for d, n in
                             zip(counts["depth_tokens"], counts["documents"])]
        counts["stage"] = ["pilot" if b.startswith("pilot_") else "collection" for b in counts["block"]]
        deepest = max(family.depth_tokens) + OVERHEAD_TOKENS
        stages = {}
        for stage, part in counts.groupby("stage"):
            checkpoints = sorted({getattr(family, readers[b]) for b in part["block"]} - {None})
            largest = max(checkpoints, key=lambda c: ARCHITECTURES[c][0])
            stages[stage] = {"documents": int(part["documents"].sum()), "hours": round(part["seconds"].sum() / 3600, 2),
                             "checkpoints": checkpoints,
                             "memory_at_deepest": memory_gib(largest, deepest, batch) | {"checkpoint": largest}}
        by_block = (counts.groupby("block", sort=False)[["documents", "seconds"]].sum()
                    .assign(hours=lambda t: (t["seconds"] / 3600).round(3)).drop(columns="seconds"))
        out["families"][key] = {
            "depth_tokens": list(family.depth_tokens), "documents": int(counts["documents"].sum()),
            "hours": round(counts["seconds"].sum() / 3600, 2), "stages": stages,
            "blocks": {b: {"documents": int(r.documents), "hours": float(r.hours)} for b, r in by_block.iterrows()},
        }
        print(f"{key}: {out['families'][key]['documents']:,} documents, {out['families'][key]['hours']:.1f} h on one "
              f"{gpu['device']}; " + "; ".join(f"{s} {v['documents']:,} docs {v['hours']:.1f} h, "
                                              f"{v['memory_at_deepest']['total_gib']} GiB" for s, v in stages.items()))
    path = ROOT / "benchmarks" / "results" / "family_projection.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
