"""Issue 26, item 5: one registered depth partition of the primary block, scored by the
product's own scoring loop with a random-weight model of Qwen2.5-7B's full configuration in
bfloat16 on a GPU; and a sample of its documents scored again on the CPU in float32.

    python benchmarks/rehearsal_gpu.py --depth d4                  # on the GPU host (carry below)
    .venv/bin/python benchmarks/rehearsal_gpu.py --smoke           # a tiny Qwen2 on the CPU (seconds)

What runs is what ``confirmatory_scores`` runs on a lab's host: the registered trial table of
qwen2.5-7b at one depth (``design.table.build_trial_table`` with the registered frame selection
and the first five registered names, as a rehearsal's name gate picks them), restricted to the
``primary`` block; its requests (``design.requests.build_requests``: report, recall, forced
choice and the greedy answer); and ``design.document_scores.score_requests`` on the engine the
site configuration would build (``--pack-tokens``, ``--generation-batch``). The weights are a
seeded random initialisation of the published configuration (``benchmarks/gpu.py``), so no
download is needed and the timings are those of the real shapes; the scores mean nothing.

Figures (``benchmarks/results/rehearsal_gpu.json``, and printed): documents, tokens, wall time
and documents/s of the partition; peak GPU memory (``torch.cuda.max_memory_allocated``); and
for the first ``--agreement`` documents, the same weights upcast to float32 on the CPU through
the same loop: the largest and mean absolute difference of the per-token log-probabilities of
every scored continuation (nats per token, and summed), of the forced-choice log-probabilities, and the share of greedy
answers that are token-identical (random weights have near-ties, so bf16 may pick another
token where float32 does).

The tokenizer is the registered Qwen2.5 one, read from the rehearsal stand-in's directory
(``data/cache/rehearsal_models/Qwen--Qwen2.5-7B-Instruct``, built by ``fear rehearse``); the
GPU host needs only its tokenizer files: ``--tokenizer DIR`` (e.g. a copy carried to the host).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config  # noqa: E402

from benchmarks.gpu import build_model, qwen25_7b_config  # noqa: E402
from fear_assets.core.registered import registered  # noqa: E402
from fear_assets.core.settings import load_settings  # noqa: E402
from fear_assets.design.document_scores import ScoringSettings, score_requests  # noqa: E402
from fear_assets.design.documents import DocumentBuilder  # noqa: E402
from fear_assets.design.requests import build_requests  # noqa: E402
from fear_assets.design.table import build_trial_table  # noqa: E402
from fear_assets.design.trials import registered_selection  # noqa: E402
from fear_assets.lm.engine import TeacherForcedEngine  # noqa: E402
from fear_assets.lm.tokenizers import end_of_turn_ids  # noqa: E402
from fear_assets.stimuli.bank import load_bank  # noqa: E402

FAMILY = "qwen2.5-7b"
BLOCK = "primary"
CHECKPOINT = "Qwen/Qwen2.5-7B-Instruct"
STAND_IN = ROOT / "data" / "cache" / "rehearsal_models" / "Qwen--Qwen2.5-7B-Instruct"
RESULTS = ROOT / "benchmarks" / "results" / "rehearsal_gpu.json"


def smoke_config() -> Qwen2Config:
    """Qwen2 at toy size with the registered vocabulary (the registered tokenizer's ids fit)."""
    return Qwen2Config(vocab_size=152064, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=False)


def partition_requests(depth: str, tokenizer, limit: int | None):
    """The primary block's requests of ``FAMILY``'s registered trial table at ``depth``."""
    settings = load_settings()
    bank = load_bank(settings=settings)
    family = settings.family(FAMILY)
    names = list(settings.name_rules.registered_order[:settings.name_rules.selected_count])
    tokenizers = {"tested": tokenizer, "judge": tokenizer, "base": tokenizer}
    table, _ = build_trial_table(settings, bank, FAMILY, family.depth_index(depth), tokenizers, names,
                                 selection=registered_selection(settings, bank, family), blocks=[BLOCK])
    if limit:
        table = table.head(limit)
    builder = DocumentBuilder(settings, bank, FAMILY, names, tokenizers)
    view = registered(settings, FAMILY)
    config = ScoringSettings(settings.models[CHECKPOINT].context_window, view.generation.max_new_tokens,
                             view.probe.layers_fraction_from)
    return table, build_requests(table, bank.templates, builder.document_text), config


def score(model, tokenizer, requests, config, pack_tokens: int, generation_batch: int, device: torch.device):
    engine = TeacherForcedEngine(model, pack_tokens=pack_tokens, generation_batch=generation_batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    long, readouts, _ = score_requests(engine, tokenizer, requests, config, eos_ids=end_of_turn_ids(tokenizer))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return long, readouts, time.perf_counter() - t


def agreement(long_gpu, readouts_gpu, long_cpu, readouts_cpu) -> dict:
    """How the GPU's bfloat16 scores of the documents the CPU scored agree with its float32 ones."""
    merged = long_gpu.merge(long_cpu, on=["request", "branch", "label"], suffixes=("_gpu", "_cpu"))
    per_token = (merged["mean_logprob_gpu"] - merged["mean_logprob_cpu"]).abs()
    summed = (merged["sum_logprob_gpu"] - merged["sum_logprob_cpu"]).abs()
    gpu = readouts_gpu.set_index("request").loc[list(readouts_cpu["request"])]
    cpu = readouts_cpu.set_index("request")
    choice = []
    for column in (c for c in cpu.columns if c.endswith("_choice_logprobs")):
        for a, b in zip(gpu[column], cpu[column]):
            if isinstance(a, str) and isinstance(b, str):
                choice += [abs(x - y) for x, y in zip(json.loads(a), json.loads(b))]
    same = [x == y for x, y in zip(gpu["generated_text"], cpu["generated_text"])] if "generated_text" in cpu else []
    return {"documents": int(len(cpu)), "continuations": int(len(merged)),
            "max_abs_mean_logprob_diff_nats_per_token": float(per_token.max()),
            "mean_abs_mean_logprob_diff_nats_per_token": float(per_token.mean()),
            "max_abs_sum_logprob_diff_nats": float(summed.max()),
            "max_abs_choice_logprob_diff": float(max(choice)) if choice else None,
            "greedy_answers_identical": f"{sum(same)} of {len(same)}"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depth", default="d4", help="the registered depth partition (default d4, 1,024 tokens)")
    p.add_argument("--limit", type=int, default=None, help="score only the first N rows (default: the partition)")
    p.add_argument("--agreement", type=int, default=2, help="documents scored again in float32 on the CPU")
    p.add_argument("--pack-tokens", type=int, default=4096)
    p.add_argument("--generation-batch", type=int, default=64)
    p.add_argument("--tokenizer", default=str(STAND_IN), help="a directory holding the registered Qwen2.5 tokenizer")
    p.add_argument("--smoke", action="store_true", help="a toy Qwen2 on the CPU, 6 rows (checks the script)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if not args.smoke and device.type != "cuda":
        raise SystemExit("no GPU: run with --smoke on a CPU (the full configuration needs a GPU)")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    t = time.perf_counter()
    table, requests, config = partition_requests(args.depth, tokenizer, 6 if args.smoke else args.limit)
    build_s = time.perf_counter() - t
    cfg = smoke_config() if args.smoke else qwen25_7b_config()
    dtype = torch.float32 if args.smoke else torch.bfloat16
    t = time.perf_counter()
    model = build_model(cfg, device, dtype, "sdpa")
    init_s = time.perf_counter() - t
    long, readouts, seconds = score(model, tokenizer, requests, config, args.pack_tokens, args.generation_batch, device)
    row = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0) if device.type == "cuda" else f"{platform.machine()} CPU (smoke)",
           "config": "toy Qwen2 (smoke)" if args.smoke else "Qwen2.5-7B published configuration, random weights",
           "dtype": str(dtype).removeprefix("torch."), "family": FAMILY, "block": BLOCK, "depth": args.depth,
           "depth_tokens": load_settings().family(FAMILY).depth_tokens[int(args.depth[1:]) - 1],
           "documents": len(requests), "excluded_context": int(readouts["excluded_context"].sum())
           if "excluded_context" in readouts else None, "tokens": int(readouts["n_tokens"].sum()),
           "table_seconds": round(build_s, 1), "init_seconds": round(init_s, 1), "score_seconds": round(seconds, 1),
           "documents_per_second": round(len(requests) / seconds, 2),
           "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None,
           "pack_tokens": args.pack_tokens, "generation_batch": args.generation_batch}
    print(json.dumps(row), flush=True)
    if args.agreement:
        n = min(args.agreement, len(requests))
        cpu = copy.deepcopy(model).to(device="cpu", dtype=torch.float32)
        del model
        torch.set_num_threads(os.cpu_count() or 1)
        t = time.perf_counter()
        long_cpu, readouts_cpu, _ = score(cpu, tokenizer, requests[:n], config, args.pack_tokens,
                                          args.generation_batch, torch.device("cpu"))
        row["agreement_cpu_float32"] = agreement(long, readouts, long_cpu, readouts_cpu) | {
            "cpu_seconds": round(time.perf_counter() - t, 1)}
        print(json.dumps(row["agreement_cpu_float32"]), flush=True)
    if not args.smoke:
        RESULTS.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
