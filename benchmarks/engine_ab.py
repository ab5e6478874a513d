"""The scoring engine of a git revision against the working tree's, side by side in one run.

Both engines score the same documents on the same random-weight model (a stand-in's shape: a
registered vocabulary, a tiny body, so the per-document readout is what is timed), alternating
A and B each repetition, and every response must be identical (the test of a refactor that
must not move a score). Writes benchmarks/results/engine_ab.json.

    nice -n 5 .venv/bin/python benchmarks/engine_ab.py --baseline 04bdc05 [--docs 40 --reps 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_engine(revision: str, where: Path):
    """``fear_assets/lm/engine.py`` as it was at ``revision``, imported as its own module."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:fear_assets/lm/engine.py"], check=True,
                            capture_output=True, text=True).stdout
    path = where / "engine_baseline.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("fear_assets.lm.engine_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def documents(n: int, seed: int, vocab: int, prefix_tokens: int, prompts: int, continuations: int):
    """A document as the scoring path sends it: a shared prefix, then per prompt (a branch)
    several continuations (report strings) and a forced-choice next-token read."""
    from fear_assets.lm.requests import Request

    rng = random.Random(seed)
    token = lambda: rng.randrange(1000, vocab - 1)  # noqa: E731
    out = []
    for _ in range(n):
        prefix = [token() for _ in range(prefix_tokens)]
        requests = []
        for _ in range(prompts):
            prompt = [token() for _ in range(5)]
            requests += [Request.loglikelihood(prompt, [token() for _ in range(6)]) for _ in range(continuations)]
            requests.append(Request.next_token(prompt, [11, 12, 13]))
        out.append((prefix, requests))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="the git revision whose engine is arm A")
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=151_936, help="Qwen2.5's vocabulary (the registered tokenizer's)")
    ap.add_argument("--prefix", type=int, default=300, help="prefix tokens per document")
    args = ap.parse_args()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import fear_assets.lm.engine as current

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread: the shared machine's other load moves a figure less
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).eval()
    docs = documents(args.docs, 0, args.vocab, args.prefix, prompts=3, continuations=6)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_engine(args.baseline, Path(tmp))

        def run(module):
            engine = module.TeacherForcedEngine(model, reuse_prefix=False)
            t = time.perf_counter()
            out = []
            for prefix, requests in docs:
                responses, _ = engine.start(prefix, requests)
                out.append([(r.score, r.logprobs) for r in responses])
            return time.perf_counter() - t, out

        times = {"baseline": [], "working_tree": []}
        identical = True
        load_before = os.getloadavg()
        for _ in range(args.reps):
            a, out_a = run(baseline)
            b, out_b = run(current)
            times["baseline"].append(a)
            times["working_tree"].append(b)
            identical = identical and out_a == out_b
    ratios = [a / b for a, b in zip(times["baseline"], times["working_tree"])]
    result = {"baseline": args.baseline, "docs": args.docs, "reps": args.reps, "vocab": args.vocab,
              "prefix_tokens": args.prefix, "requests_per_doc": 21, "seconds": times,
              "median_ratio_baseline_over_working_tree": statistics.median(ratios), "ratios": ratios,
              "identical_responses": identical, "load_before": load_before, "load_after": os.getloadavg()}
    (ROOT / "benchmarks" / "results" / "engine_ab.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
