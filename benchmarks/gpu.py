"""GPU path of the LM engine: prefill and packed continuation passes of a random-initialised
Qwen2.5-7B architecture, tokens/s and model FLOP utilisation, and a family's projected
scoring time.

No weights are downloaded: the Qwen2.5-7B architecture is built from its published
configuration (below) and initialised at random, in bfloat16, with PyTorch SDPA (its flash
kernel on the causal prefill; FlashAttention-2 proper does not take the engine's 4D packed
masks). Timings do not depend on the weights' values.

Run (from the repository root, on a GPU host):

    .venv/bin/python benchmarks/gpu.py                 # depths 1,024..16,384 tokens; writes results/gpu.json
    .venv/bin/python benchmarks/gpu.py --smoke         # tiny config on CPU, seconds (CI smoke test)

What it measures, per document length T (context tokens):
  prefill       one forward over T tokens, logits of the last position only (the engine's prefill);
  packed pass   the full per-document branch set after the cached prefix, as the engine runs
                it: report (7 continuations), recall (2), forced choice (1 next-token read) --
                branch prompts and continuations packed into one row (``from_cache``);
  decode step   one greedy step of ``--generation-batch`` documents decoded together
                (left-padded caches of length T), as the engine's batched generation runs.
Each is timed ``--reps`` times after a warm-up (CUDA synchronised), median kept.

MFU = model FLOPs / seconds / the GPU's dense bf16 peak (a table of known GPUs; otherwise
the best bf16 matmul measured in the same run, and the output says so). Model FLOPs of a
forward over n new tokens with k attended keys each on average:
    2 * P_matrices * n + 4 * n_layers * (n_heads * head_dim) * n * k + 2 * d_model * V * n_logits
(causal prefill: k = (T + 1) / 2; weights of embeddings not counted).

Projection: a family's primary documents (``--documents-per-depth`` per registered depth of
``--family``; 14,400 over eight depths for the registered design) at document length
depth + ``--overhead-tokens`` (the chat template, system prompt, event and question around
the distractors), each costing prefill + packed pass + its share of batched decoding of
``max_new_tokens`` (the registered generation length). Depths between measured lengths are
interpolated in log-log space.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402

from fear_assets.lm.engine import TeacherForcedEngine  # noqa: E402
from fear_assets.lm.requests import Request  # noqa: E402
from fear_assets.core.settings import load_settings  # noqa: E402

RESULTS_JSON = ROOT / "benchmarks" / "results" / "gpu.json"
LENGTHS = [1024, 2048, 4096, 8192, 16384]
SMOKE_LENGTHS = [48, 96]

#: Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' data sheets.
PEAKS = {"H200": 989.4e12, "H100 SXM": 989.4e12, "H100 80GB HBM3": 989.4e12, "H100 PCIe": 756.5e12,
         "H100": 989.4e12, "A100": 312e12, "L40S": 362.1e12, "L4": 121e12, "A10": 125e12}

# The branch set of one document (token counts as in the registered templates, rounded up):
# branch prompt tokens after the shared prefix, and continuation lengths.
BRANCHES = {"report": (24, [14, 12, 17, 15, 13, 11, 16]), "recall": (30, [18, 16]), "forced_choice": (60, [])}


def qwen25_7b_config() -> Qwen2Config:
    """Qwen2.5-7B(-Instruct)'s published architecture (config.json), built offline."""
    return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       use_sliding_window=False, hidden_act="silu")


def tiny_config() -> Qwen2Config:
    """The same family of architecture at toy size (the CPU smoke test)."""
    return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=False)


def attention_implementation(device: torch.device) -> str:
    """SDPA: the engine's packed passes and batched decoding pass 4D masks, which the
    FlashAttention-2 integration does not take; PyTorch's SDPA runs its flash kernel on the
    unmasked causal prefill and its memory-efficient kernel on the masked passes."""
    return "sdpa"


def build_model(config: Qwen2Config, device: torch.device, dtype: torch.dtype, attn: str):
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def dims(model) -> dict:
    c = model.config
    matrices = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"params": sum(p.numel() for p in model.parameters()), "layer_matrix_params": matrices,
            "n_layers": c.num_hidden_layers, "d_model": c.hidden_size, "attn_width": c.num_attention_heads * head_dim,
            "vocab": c.vocab_size}


def forward_flops(d: dict, n_tokens: int, mean_keys: float, n_logits: int) -> float:
    return (2 * d["layer_matrix_params"] * n_tokens + 4 * d["n_layers"] * d["attn_width"] * n_tokens * mean_keys
            + 2 * d["d_model"] * d["vocab"] * n_logits)


def prefill_flops(d: dict, T: int) -> float:
    return forward_flops(d, T, (T + 1) / 2, 1)


def packed_flops(d: dict, T: int) -> float:
    total = 0.0
    for prompt, conts in BRANCHES.values():
        total += forward_flops(d, prompt, T + (prompt + 1) / 2, 1)
        for n in conts:
            total += forward_flops(d, n - 1, T + prompt + n / 2, n - 1)
    return total


def decode_flops(d: dict, T: int, batch: int) -> float:
    return forward_flops(d, batch, T, batch)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, reps: int) -> float:
    fn()  # warm-up (kernels, allocator)
    _sync(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_peak(device, dtype, n: int) -> float:
    x, y = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / timed(lambda: torch.matmul(x, y), device, 5)


def branch_requests(rng: torch.Generator, vocab: int) -> list[Request]:
    def ids(n):
        return torch.randint(0, vocab, (n,), generator=rng).tolist()

    requests = []
    for name, (prompt_len, conts) in BRANCHES.items():
        prompt = ids(prompt_len)
        requests.append(Request.next_token(prompt, [1, 2]))
        requests += [Request.loglikelihood(prompt, ids(n)) for n in conts]
    return requests


@torch.inference_mode()
def measure_length(engine: TeacherForcedEngine, d: dict, T: int, reps: int, batch: int, device) -> dict:
    rng = torch.Generator().manual_seed(T)
    prefix = torch.randint(0, d["vocab"], (T,), generator=rng).tolist()
    requests = branch_requests(rng, d["vocab"])
    t_prefill = timed(lambda: engine.prefill(prefix), device, reps)
    cache, logits, _ = engine.prefill(prefix)
    t_packed = timed(lambda: engine.from_cache(cache, logits[-1], requests), device, reps)
    # One decoding step of `batch` documents of length T (the engine's batched generation):
    # the difference between decoding 10 and 2 tokens, over 8 steps, so the one-off stacking
    # of the documents' caches is not counted per step.
    runs = {}
    for n in (2, 10):
        _, states = engine.from_cache(cache, logits[-1], [Request.generate(requests[0].prompt, n)])
        many = [states[0]] * batch
        runs[n] = timed(lambda: engine.generate(many), device, reps)
        del states, many
    t_step = max(runs[10] - runs[2], 1e-9) / 8
    out = {"tokens": T, "prefill_s": t_prefill, "packed_pass_s": t_packed, "decode_step_s": t_step,
           "prefill_flops": prefill_flops(d, T), "packed_flops": packed_flops(d, T),
           "decode_flops": decode_flops(d, T, batch)}
    out["prefill_tokens_per_s"] = T / t_prefill
    out["prefill_flops_per_s"] = out["prefill_flops"] / t_prefill
    out["packed_flops_per_s"] = out["packed_flops"] / t_packed
    out["decode_tokens_per_s"] = batch / t_step
    del cache
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Log-log interpolation (linear extrapolation at the ends)."""
    points = sorted(points)
    if x <= 0:
        x = 1.0
    lx = math.log(x)
    if len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1 or (x1, y1) == points[-1]:
            a = (math.log(y1) - math.log(y0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + a * (lx - math.log(x0)))
    return points[-1][1]


def project(rows: list[dict], depths: list[int], documents_per_depth: int, overhead: int, max_new_tokens: int,
            batch: int) -> dict:
    """Seconds to score a family's primary documents: per document prefill + packed pass +
    its share of batched decoding (max_new_tokens steps for ``batch`` documents)."""
    per_depth = []
    for depth in depths:
        T = depth + overhead
        prefill = interpolate([(r["tokens"], r["prefill_s"]) for r in rows], T)
        packed = interpolate([(r["tokens"], r["packed_pass_s"]) for r in rows], T)
        step = interpolate([(r["tokens"], r["decode_step_s"]) for r in rows], T)
        per_doc = prefill + packed + step * max_new_tokens / batch
        per_depth.append({"depth": depth, "tokens": T, "seconds_per_document": per_doc,
                          "seconds": per_doc * documents_per_depth})
    return {"documents": documents_per_depth * len(depths), "per_depth": per_depth,
            "seconds": sum(p["seconds"] for p in per_depth)}


def run(argv=None) -> dict:
    """Measure and project; returns the result written to results/gpu.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny config on CPU (CI smoke test), seconds")
    ap.add_argument("--lengths", help="comma-separated document lengths in tokens (default 1024..16384)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--family", default="qwen2.5-7b", help="registered family whose depths are projected")
    ap.add_argument("--documents-per-depth", type=int, default=1800,
                    help="primary documents per depth (14,400 / 8 depths in the registered design)")
    ap.add_argument("--overhead-tokens", type=int, default=140,
                    help="document tokens around the distractors (1,163 - 1,024 in benchmarks/scoring.py)")
    ap.add_argument("--generation-batch", type=int, default=16)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke on a CPU, or on a GPU host")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    config = tiny_config() if args.smoke else qwen25_7b_config()
    attn = attention_implementation(device)
    model = build_model(config, device, dtype, attn)
    engine = TeacherForcedEngine(model, pack_tokens=1024, generation_batch=args.generation_batch)
    d = dims(model)
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else (SMOKE_LENGTHS if args.smoke else LENGTHS)
    reps = 1 if args.smoke else args.reps

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    table_peak = next((v for k, v in PEAKS.items() if k in name), None)
    measured_peak = matmul_peak(device, dtype, 256 if args.smoke else 8192)
    peak = table_peak or measured_peak
    peak_source = "data sheet (dense bf16)" if table_peak else "best matmul measured in this run"

    rows = []
    for T in lengths:
        r = measure_length(engine, d, T, reps, args.generation_batch, device)
        r["prefill_mfu"] = r["prefill_flops_per_s"] / peak
        r["packed_mfu"] = r["packed_flops_per_s"] / peak
        rows.append(r)
        print(f"T={T:>6}: prefill {r['prefill_s'] * 1e3:8.1f} ms ({r['prefill_tokens_per_s']:9.0f} tok/s, "
              f"MFU {100 * r['prefill_mfu']:5.1f}%)  packed pass {r['packed_pass_s'] * 1e3:7.1f} ms "
              f"(MFU {100 * r['packed_mfu']:5.1f}%)  decode step x{args.generation_batch} "
              f"{r['decode_step_s'] * 1e3:7.1f} ms", flush=True)

    settings = load_settings()
    family = settings.family(args.family)
    max_new = int(settings.generation.max_new_tokens)
    projection = project(rows, list(family.depth_tokens), args.documents_per_depth, args.overhead_tokens, max_new,
                         args.generation_batch)
    mfu_4k = [r["prefill_mfu"] for r in rows if r["tokens"] >= 4096]
    result = {
        "mode": "smoke" if args.smoke else "gpu", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/gpu.py", *(sys.argv[1:] if argv is None else argv)]),
        "device": name, "dtype": str(dtype).replace("torch.", ""), "attn_implementation": attn,
        "torch": torch.__version__, "config": "tiny" if args.smoke else "Qwen2.5-7B (random init)", "dims": d,
        "peak_flops": peak, "peak_source": peak_source, "matmul_measured_flops": measured_peak,
        "generation_batch": args.generation_batch, "lengths": rows,
        "projection": {"family": args.family, "max_new_tokens": max_new, "overhead_tokens": args.overhead_tokens,
                       **projection},
        "min_prefill_mfu_at_4096_and_more": min(mfu_4k) if mfu_4k else None,
        "wall_seconds": time.perf_counter() - started,
    }
    hours = projection["seconds"] / 3600
    if args.smoke:
        print("smoke run: a toy model at toy lengths; its projection only exercises the code")
    print(f"projection: {args.family}, {projection['documents']} primary documents: {projection['seconds']:.0f} s "
          f"({hours:.2f} h) on this device")
    if not args.no_write:
        RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
        all_results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.is_file() else {}
        all_results[result["mode"]] = result
        RESULTS_JSON.write_text(json.dumps(all_results, indent=2) + "\n")
    mfu_text = f"{100 * result['min_prefill_mfu_at_4096_and_more']:.1f}%" if mfu_4k else "n/a"
    print(f"prefill_mfu_min_4096plus={mfu_text} projected_family_hours={hours:.2f}")
    return result


def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
