"""A long prefix in one forward vs in chunks through the cache (CPU).

    nice -n 10 .venv/bin/python benchmarks/prefill_chunks.py          # ~3 min on 2 cores

The rehearsal stand-ins (``data/cache/rehearsal_models``, built by ``fear rehearse``) at the
registered depths where a prefill is long: Gemma-2 (eager attention, which its soft-capping
needs, with the alternating 4,096-token sliding window) at 2,048 and 6,144 tokens, Qwen2
(SDPA) at 4,096 and 16,384. Each prefix is timed side by side, one pass and in chunks of
512, 1,024 and 4,096 tokens (``TeacherForcedEngine.prefill`` with that ``prefill_chunk``), the
best of ``--reps`` each, in the same process on the same random token ids; the last logits
of every chunking are checked against the one pass. Ratios are one pass / chunked (above
1: chunking is faster). Writes ``benchmarks/results/prefill_chunks.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from fear_assets.lm.engine import TeacherForcedEngine

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "cache" / "rehearsal_models"
CASES = {"google--gemma-2-9b-it": ("eager", (2048, 6144)), "Qwen--Qwen2.5-7B-Instruct": ("sdpa", (4096, 16384))}
CHUNKS = (512, 1024, 4096)


def best(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, (attn, lengths) in CASES.items():
        path = MODELS / name
        if not path.is_dir():
            raise SystemExit(f"{path} is missing: build the stand-ins once with `bash scripts/fear rehearse "
                             "qwen2.5-7b --through stimuli` (and gemma-2-9b)")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn).eval()
        for n in lengths:
            ids = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            one_s, (_, one_logits, _) = best(lambda: TeacherForcedEngine(model, prefill_chunk=0).prefill(ids), args.reps)
            row = {"model": name, "attn_implementation": attn, "prefix_tokens": n, "one_pass_s": round(one_s, 3)}
            for c in CHUNKS:
                if c >= n:
                    continue
                s, (_, logits, _) = best(lambda: TeacherForcedEngine(model, prefill_chunk=c).prefill(ids), args.reps)
                row[f"chunk_{c}_s"] = round(s, 3)
                row[f"ratio_chunk_{c}"] = round(one_s / s, 2)
                row[f"max_abs_logit_diff_chunk_{c}"] = float((logits - one_logits).abs().max())
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = {"command": "nice -n 10 .venv/bin/python benchmarks/prefill_chunks.py",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{os.uname().machine}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end",
           "threads": args.threads, "reps": args.reps, "rows": rows}
    (ROOT / "benchmarks" / "results" / "prefill_chunks.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
