"""Teacher-forced scoring engine vs lm-evaluation-harness vs a naive forward (CPU).

Install the baseline once (not a project dependency; a ``bench`` extra is planned):

    /work/main/.venv/bin/pip install lm-eval==0.4.13

Run (from the repository root):

    nice -n 10 .venv/bin/python benchmarks/scoring.py          # full: depths 128..2,048, 3 documents each (~15 min)
    nice -n 10 .venv/bin/python benchmarks/scoring.py --quick  # reduced: depths 1,024 and 2,048 (~4 min)

Each document is measured twice: its report continuations alone (a, b, c below), and its
full branch set (report, recall and forced choice on one prefill; (a) and (b) only).

Requests. Each document is a ``pilot_primary`` row of the embedded family's design (its
registered frame selection: pilot frame TER-01, one confirmatory frame per fear), and its
continuations are the row's report strings (agent: name / role / quotation / first person;
partner: name / role / quotation). Depths 128 and 512 are the embedded family's own trial
table (``smollm2-135m`` d2, d3); the embedded family registers no deeper depth, so depths
1,024 and 2,048 are the same design rendered at the primary family's registered depths
(``qwen2.5-7b`` d4, d5). All documents are rendered, tokenized and scored by SmolLM2-135M
(float32, the embedded checkpoint), which is the reader of every block here.

Identical token splits. lm-eval's ``_encode_pair`` moves ALL trailing whitespace of the
context into the continuation, the engine's ``encode_pair`` keeps a trailing newline in the
context. Every request is therefore given to both as the same string pair whose context
ends without whitespace: context = document minus its final "\n" (the end of the chat
template's assistant header), continuation = "\n" + report. The benchmark checks, for every
request, that ``encode_pair`` yields exactly the token ids of ``HFLM._encode_pair`` and stops
if not.

Methods, timed side by side on the same requests (tokenization included in each):
  (a) ``TeacherForcedEngine``: one prefill per document (last position's logits only), then
      all continuations of the document packed into one row after the cached prefix.
  (b) lm-eval ``HFLM.loglikelihood`` on an already-loaded model object (its own batching,
      sorting and one-token logits cache left at their defaults, ``--lm-eval-batch-size``).
  (c) ``naive_scores``: one full forward of context + continuation per continuation.

Figures per depth: documents, continuations, request tokens (sum over requests of context
+ continuation tokens: the same numerator for all methods, so tokens/s ratios are time
ratios), seconds, tokens/s, ratios a/b and a/c, the maximum absolute score difference per
token (|sum_a - sum_b| / n_tokens, maximum over continuations) of a vs b and a vs c, and
(a)'s achieved FLOP/s against a 2048x2048 float32 ``torch.matmul`` peak measured in the
same run (best of several repetitions, at the start and at the end of the run).

FLOPs of (a) per document, counting useful work only (padding excluded):
    2 * N_layers_params * T  +  2 * d_model * V * T_logits  +  4 * n_layers * (n_heads * head_dim) * K
with T = prefill tokens + sum(len(continuation) - 1) tokens run through the decoder,
T_logits = 1 + sum(len(continuation) - 1) positions whose logits are computed, and
K = sum over those query tokens of the keys each attends to (causal: P(P+1)/2 for the
prefill of P tokens, then P + j for the j-th token of a continuation).

Timing: ``torch.set_num_threads(2)``; each method is warmed up once on a short request;
then for every document the three methods run one after another (a, b, c), ``--reps``
times; per document and method the fastest repetition is kept (noise on a shared machine
only adds time) and a depth's seconds are the sum over its documents. lm-eval gets one
document's requests per call. No timing is asserted anywhere.

The last line printed is ``speedup_vs_lm_eval=<a/b at the deepest depth> max_abs_diff=<max
nats/token, a vs b, all depths, both sets> speedup_full_branch_set=<a/b of the full branch set
at the deepest depth>``. Figures go to ``benchmarks/results/scoring.json`` (one
entry per mode, full and quick) and ``benchmarks/RESULTS.md`` is regenerated from it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from fear_assets.design.documents import DocumentBuilder  # noqa: E402
from fear_assets.design.table import build_trial_table  # noqa: E402
from fear_assets.design.trials import registered_selection  # noqa: E402
from fear_assets.lm.engine import TeacherForcedEngine, encode_pair, naive_scores  # noqa: E402
from fear_assets.lm.requests import Request  # noqa: E402
from fear_assets.lm.runner import run  # noqa: E402
from fear_assets.design.requests import build_requests  # noqa: E402
from fear_assets.lm.models import load_model, registry  # noqa: E402
from fear_assets.core.settings import DEFAULT_BANK_DIR, load_settings  # noqa: E402
from fear_assets.stimuli.bank import load_bank  # noqa: E402

EMBEDDED = "smollm2-135m"
PRIMARY = "qwen2.5-7b"
NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]
BLOCK = "pilot_primary"
THREADS = 2
INSTALL = "/work/main/.venv/bin/pip install lm-eval==0.4.13"
RESULTS_JSON = ROOT / "benchmarks" / "results" / "scoring.json"
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"

#: (label, family whose trial table supplies the documents, depth index in that family)
FULL_DEPTHS = [(128, EMBEDDED, 2), (512, EMBEDDED, 3), (1024, PRIMARY, 4), (2048, PRIMARY, 5)]
QUICK_DEPTHS = [(1024, PRIMARY, 4), (2048, PRIMARY, 5)]


# ---------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------
@dataclass
class Document:
    trial_id: str
    family: str
    depth_key: str
    context: str  # the document without its final "\n"
    continuations: list[str]  # "\n" + report, one per report string
    labels: list[str]
    context_ids: list[int] = field(default_factory=list)
    continuation_ids: list[list[int]] = field(default_factory=list)
    # The full per-document branch set: branch -> (context, continuations), each context the
    # branch text without its final "\n"; report, recall and forced choice ("\nA", "\nB").
    branches: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    branch_ids: dict[str, tuple[list[int], list[list[int]]]] = field(default_factory=dict)


def report_strings(continuations_json: str) -> list[tuple[str, str]]:
    data = json.loads(continuations_json)
    out = []
    for side in ("agent", "partner"):
        for key in ("name", "role", "quotation", "first_person"):
            if key in data.get(side, {}):
                out.append((f"{side}.{key}", data[side][key]))
    return out


def select_documents(settings, bank, tokenizer, depth_plan, n_docs: int) -> dict[int, list[Document]]:
    """``n_docs`` distinct pilot_primary documents per depth, spread over the table's rows."""
    tokenizers = {"tested": tokenizer, "judge": tokenizer, "base": tokenizer}
    selection = registered_selection(settings, bank, settings.family(EMBEDDED))
    out: dict[int, list[Document]] = {}
    for label, family_key, depth_index in depth_plan:
        table, _ = build_trial_table(settings, bank, family_key, depth_index, tokenizers, NAMES,
                                     selection=selection)
        rows = table[table["block"] == BLOCK].drop_duplicates("document_sha256")
        rows = rows[rows["continuations"] != "{}"]
        step = max(1, len(rows) // n_docs)
        picked = rows.iloc[::step].head(n_docs)
        builder = DocumentBuilder(settings, bank, family_key, NAMES, tokenizers)
        branch_sets = {r.key: r for r in build_requests(picked, bank.templates, builder.document_text)}
        docs = []
        for row in picked.to_dict("records"):
            text = builder.document_text(row)
            if not text.endswith("<|im_start|>assistant\n"):
                raise SystemExit(f"{row['trial_id']}: the document does not end with the assistant header")
            reports = report_strings(row["continuations"])
            doc = Document(row["trial_id"], family_key, f"d{depth_index}", text[:-1],
                           ["\n" + r for _, r in reports], [k for k, _ in reports])
            req = branch_sets[row["trial_id"]]
            for b in ("report", "recall", "forced_choice"):
                branch_text = req.branches[b]
                if not branch_text.endswith("<|im_start|>assistant\n"):
                    raise SystemExit(f"{row['trial_id']}: the {b} branch does not end with the assistant header")
                conts = (list(req.continuations[b].values()) if b in req.continuations
                         else req.choices[b])
                doc.branches[b] = (branch_text[:-1], ["\n" + c for c in conts])
            docs.append(doc)
        out[label] = docs
    return out


def tokenize(docs: dict[int, list[Document]], encode) -> None:
    for depth_docs in docs.values():
        for doc in depth_docs:
            pairs = [encode_pair(encode, doc.context, c) for c in doc.continuations]
            doc.context_ids = pairs[0][0]
            doc.continuation_ids = [p[1] for p in pairs]
            if any(p[0] != doc.context_ids for p in pairs):
                raise SystemExit(f"{doc.trial_id}: the context tokens depend on the continuation")
            for b, (context, conts) in doc.branches.items():
                pairs = [encode_pair(encode, context, c) for c in conts]
                if any(p[0] != pairs[0][0] for p in pairs):
                    raise SystemExit(f"{doc.trial_id}: the {b} context tokens depend on the continuation")
                doc.branch_ids[b] = (pairs[0][0], [p[1] for p in pairs])


def _lcp(seqs) -> int:
    seqs = list(seqs)
    n = min(len(x) for x in seqs)
    for i in range(n):
        if any(x[i] != seqs[0][i] for x in seqs[1:]):
            return i
    return n


# ---------------------------------------------------------------------------------------
# The three methods (each from strings to per-continuation scores, tokenization included)
# ---------------------------------------------------------------------------------------
def run_engine(engine, encode, docs):
    out = []
    for doc in docs:
        pairs = [encode_pair(encode, doc.context, c) for c in doc.continuations]
        scores = [r.score for r in run(engine, [(pairs[0][0], [Request.loglikelihood((), p[1]) for p in pairs])])[0]]
        out += [(s.sum_logprob, s.n_tokens, s.greedy) for s in scores]
    return out


def run_engine_full(engine, encode, docs):
    """The full branch set: one prefill of the branches' common prefix, then every branch's
    prompt and continuations as requests in one packed pass (tokenization included)."""
    out = []
    for doc in docs:
        ctx = {b: encode(context) for b, (context, _) in doc.branches.items()}
        shared = min(_lcp(ctx.values()), min(len(v) for v in ctx.values()) - 1)
        requests = []
        for b, (context, conts) in doc.branches.items():
            for c in conts:
                requests.append(Request.loglikelihood(ctx[b][shared:], encode(context + c)[len(ctx[b]):]))
        (responses,) = run(engine, [(ctx["report"][:shared], requests)])
        out += [(r.score.sum_logprob, r.score.n_tokens, r.score.greedy) for r in responses]
    return out


def run_lm_eval_full(lm, docs, instance_cls):
    requests = [instance_cls(request_type="loglikelihood", doc={}, arguments=(context, c), idx=i)
                for doc in docs for context, conts in doc.branches.values() for i, c in enumerate(conts)]
    result = lm.loglikelihood(requests, disable_tqdm=True)
    n_tokens = [len(ids) for doc in docs for _, conts in doc.branch_ids.values() for ids in conts]
    return [(float(s), n, bool(g)) for (s, g), n in zip(result, n_tokens, strict=True)]


def run_lm_eval(lm, docs, instance_cls):
    requests = [instance_cls(request_type="loglikelihood", doc={}, arguments=(doc.context, c), idx=i)
                for doc in docs for i, c in enumerate(doc.continuations)]
    result = lm.loglikelihood(requests, disable_tqdm=True)
    n_tokens = [len(ids) for doc in docs for ids in doc.continuation_ids]
    return [(float(s), n, bool(g)) for (s, g), n in zip(result, n_tokens, strict=True)]


def run_naive(model, encode, docs, limit: int | None):
    out = []
    for doc in docs:
        conts = doc.continuations[:limit] if limit else doc.continuations
        pairs = [encode_pair(encode, doc.context, c) for c in conts]
        scores = naive_scores(model, pairs[0][0], [p[1] for p in pairs])
        out += [(s.sum_logprob, s.n_tokens, s.greedy) for s in scores]
    return out


@torch.inference_mode()
def breakdown(engine, model, doc) -> dict:
    """Where (a)'s time goes on one document, against the unit of work of (b) and (c)."""
    t = time.perf_counter()
    cache, logits, _ = engine.prefill(doc.context_ids)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    engine.from_cache(cache, logits[-1], [Request.loglikelihood((), c) for c in doc.continuation_ids])
    conts = time.perf_counter() - t
    ids = torch.tensor([doc.context_ids + doc.continuation_ids[0]])
    t = time.perf_counter()
    torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    full = time.perf_counter() - t
    distinct = len({tuple(c) for c in doc.continuation_ids})
    return {"trial_id": doc.trial_id, "engine_prefill_s": prefill, "engine_continuation_pass_s": conts,
            "full_forward_log_softmax_s": full, "continuations": len(doc.continuation_ids),
            "distinct_continuations": distinct,
            "ratio_ceiling_vs_lm_eval": distinct * full / (prefill + conts)}


def request_tokens(docs, limit: int | None = None) -> int:
    return sum(len(d.context_ids) + len(c) for d in docs
               for c in (d.continuation_ids[:limit] if limit else d.continuation_ids))


def max_diff_per_token(x, y) -> float:
    return max(abs(a[0] - b[0]) / a[1] for a, b in zip(x, y))


# ---------------------------------------------------------------------------------------
# FLOPs and the matmul peak
# ---------------------------------------------------------------------------------------
def model_dims(model) -> dict:
    c = model.config
    layer_params = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    heads, head_dim = c.num_attention_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"n_params": sum(p.numel() for p in model.parameters()), "layer_matrix_params": layer_params,
            "n_layers": c.num_hidden_layers, "d_model": c.hidden_size, "attn_width": heads * head_dim,
            "vocab": c.vocab_size}


def engine_flops(dims: dict, docs) -> tuple[float, int]:
    """(FLOPs, tokens run through the decoder) of method (a) on these documents."""
    total, tokens = 0.0, 0
    for d in docs:
        p = len(d.context_ids)
        rest = [len(c) - 1 for c in d.continuation_ids]
        t = p + sum(rest)
        keys = p * (p + 1) / 2 + sum(n * p + n * (n + 1) / 2 for n in rest)
        total += (2 * dims["layer_matrix_params"] * t + 2 * dims["d_model"] * dims["vocab"] * (1 + sum(rest))
                  + 4 * dims["n_layers"] * dims["attn_width"] * keys)
        tokens += t
    return total, tokens


def matmul_peak(n: int = 2048, reps: int = 6) -> dict:
    x, y = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(x, y)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(x, y)
        rates.append(2 * n ** 3 / (time.perf_counter() - t))
    return {"n": n, "dtype": "float32", "reps": reps, "best_flops": max(rates), "median_flops": statistics.median(rates)}


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------
def fmt_table(rows: list[dict]) -> str:
    head = ["depth", "docs", "conts", "req tokens", "a s", "b s", "c s", "a tok/s", "b tok/s", "c tok/s",
            "a/b", "a/c", "max|a-b|", "max|a-c|", "a GFLOP/s", "a % peak"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["depth_tokens"], r["documents"], r["continuations"], r["request_tokens"],
                 f"{r['a']['seconds']:.2f}", f"{r['b']['seconds']:.2f}", f"{r['c']['seconds']:.2f}",
                 f"{r['a']['tokens_per_s']:.0f}", f"{r['b']['tokens_per_s']:.0f}", f"{r['c']['tokens_per_s']:.0f}",
                 f"{r['ratio_a_over_b']:.2f}", f"{r['ratio_a_over_c']:.2f}",
                 f"{r['max_abs_diff_a_b']:.2e}", f"{r['max_abs_diff_a_c']:.2e}",
                 f"{r['a_flops_per_s'] / 1e9:.1f}", f"{100 * r['a_fraction_of_peak']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def fmt_full(rows: list[dict]) -> str:
    head = ["depth", "docs", "requests", "distinct (lm-eval)", "req tokens", "a s", "b s", "a tok/s", "b tok/s",
            "a/b", "max|a-b|"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f = r["full_set"]
        cells = [r["depth_tokens"], r["documents"], f["requests"], f["distinct_requests_lm_eval"], f["request_tokens"],
                 f"{f['a']['seconds']:.2f}", f"{f['b']['seconds']:.2f}", f"{f['a']['tokens_per_s']:.0f}",
                 f"{f['b']['tokens_per_s']:.0f}", f"{f['ratio_a_over_b']:.2f}", f"{f['max_abs_diff_a_b']:.2e}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def fmt_breakdown(rows: list[dict]) -> str:
    head = ["depth", "context tokens", "a prefill s", "a continuation pass s", "full forward s",
            "distinct / all continuations", "a/b ceiling"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = r["breakdown"]
        cells = [r["depth_tokens"], r["context_tokens"][0], f"{b['engine_prefill_s']:.2f}",
                 f"{b['engine_continuation_pass_s']:.2f}", f"{b['full_forward_log_softmax_s']:.2f}",
                 f"{b['distinct_continuations']} / {b['continuations']}", f"{b['ratio_ceiling_vs_lm_eval']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


GPU_INTRO = """## GPU (H200): `benchmarks/gpu.py`

`benchmarks/gpu.py` times, on a random-initialised Qwen2.5-7B architecture (its published
configuration built offline, bf16, PyTorch SDPA: its flash kernel on the causal prefill;
FlashAttention-2 proper does not take the engine's 4D packed masks), the engine's prefill (last position's logits only), its packed pass over one
document's full branch set (report 7 continuations, recall 2, forced choice) and one step of
batched greedy decoding (16 documents), at 1,024-16,384 tokens; it reports tokens/s and
model FLOP utilisation against the GPU's dense bf16 peak (989 TFLOP/s for an H200), and
projects the scoring time of a family's 14,400 primary documents (1,800 per registered
depth, prefill + packed pass + batched decoding of the registered 48 tokens).

```bash
.venv/bin/python benchmarks/gpu.py            # on a GPU host; writes benchmarks/results/gpu.json
.venv/bin/python benchmarks/gpu.py --smoke    # tiny config on CPU, seconds (fear_assets_tests/test_gpu_benchmark.py)
```

"""

GPU_PENDING = """**H200 figures are pending**: no device machine has measured it yet, so only the CPU smoke
test has run. Goals to check there: at least 50% MFU on prefill at 4,096 tokens and more, and a
family's 14,400 primary documents in under an hour.
"""


def gpu_note(path: Path = ROOT / "benchmarks" / "results" / "gpu.json") -> str:
    """The GPU section, from ``results/gpu.json``'s ``gpu`` entry when a GPU run is on record."""
    run = json.loads(path.read_text()).get("gpu") if path.is_file() else None
    if not run:
        return GPU_INTRO + "\n" + GPU_PENDING
    rows = ["| tokens | prefill ms | prefill tokens/s | prefill MFU | packed pass ms | packed MFU | decode step x"
            f"{run['generation_batch']} ms |", "|---|---|---|---|---|---|---|"]
    for r in run["lengths"]:
        rows.append(f"| {r['tokens']:,} | {1e3 * r['prefill_s']:.1f} | {r['prefill_tokens_per_s']:,.0f} | "
                    f"{100 * r['prefill_mfu']:.1f}% | {1e3 * r['packed_pass_s']:.1f} | {100 * r['packed_mfu']:.1f}% | "
                    f"{1e3 * r['decode_step_s']:.1f} |")
    proj = run["projection"]
    hours = proj["seconds"] / 3600

    def share(r):
        decode = r["decode_step_s"] * proj["max_new_tokens"] / run["generation_batch"]
        return f"{100 * r['prefill_s'] / (r['prefill_s'] + r['packed_pass_s'] + decode):.0f}%"

    mfu = run["min_prefill_mfu_at_4096_and_more"]
    return (GPU_INTRO + f"""
Measured {run['date']} on one {run['device']} ({run['dtype']}, attention `{run['attn_implementation']}`, torch
{run['torch']}; `{run['command']}`, run by `benchmarks/h200_run.sh`). MFU is against the data sheet's dense bf16
peak ({run['peak_flops'] / 1e12:.0f} TFLOP/s); the best bf16 matmul measured in the same run reached
{run['matmul_measured_flops'] / 1e12:.0f} TFLOP/s.

""" + "\n".join(rows) + f"""

Projection ({proj['family']}, {proj['documents']:,} primary documents, {proj['max_new_tokens']} generated tokens each,
{proj['overhead_tokens']} tokens around the distractors; depths below 1,024 tokens extrapolated in log-log
space from the measured lengths): **{proj['seconds']:,.0f} s ({hours:.2f} h)** on this GPU. Goals: prefill MFU at
4,096 tokens and more at least 50% (measured minimum **{100 * mfu:.1f}%**: {'met' if mfu >= 0.5 else 'NOT met'}),
a family's primary documents in under an hour ({'met' if hours < 1 else 'NOT met'}). The packed pass (about 250
new tokens against the cached prefix) and batched decoding are memory-bound and run far below peak; prefill's
share of a document's time (prefill + packed pass + its share of {proj['max_new_tokens']} decoding steps of
{run['generation_batch']} documents) is {share(run['lengths'][0])} at {run['lengths'][0]['tokens']:,} tokens and
{share(run['lengths'][-1])} at {run['lengths'][-1]['tokens']:,}: below a few thousand tokens, larger decoding batches
are the lever.
""")


def render_markdown(all_results: dict) -> str:
    out = ["# Benchmarks", "",
           "## Scoring engine vs lm-evaluation-harness", "",
           "`benchmarks/scoring.py` times, on identical (context, continuation) requests, "
           "(a) this project's `TeacherForcedEngine` (one prefill per document, then all continuations "
           "packed into one row after the cached prefix, block-diagonal mask, explicit positions), "
           "(b) lm-evaluation-harness 0.4.13 "
           "`HFLM.loglikelihood` (HF backend, the same loaded model object), and (c) a naive full forward "
           "per continuation (`naive_scores`). CPU only, float32, `torch.set_num_threads(2)`, "
           "SmolLM2-135M-Instruct (the embedded checkpoint).", "",
           "Requests: `pilot_primary` documents of the embedded family's design (its registered frame "
           "selection) with their report strings as continuations. Depths 128 and 512 are the embedded "
           "family's own trial table (`smollm2-135m` d2, d3); depths 1,024 and 2,048 are the same design "
           "at the registered primary-family depths (`qwen2.5-7b` d4, d5), rendered, tokenized and scored "
           "by SmolLM2. Context = document without its final newline, continuation = newline + report, so "
           "lm-eval's `_encode_pair` and the engine's `encode_pair` give the same token ids (checked for "
           "every request).", "",
           "Install the baseline first (it is not a project dependency): `" + INSTALL + "`.", "",
           "Columns: request tokens = sum over requests of context + continuation tokens (the same "
           "numerator for all three methods, so tok/s ratios are time ratios); a/b and a/c = (a)'s speed "
           "over (b)'s and (c)'s; max|a-b| = max over continuations of |sum log p (a) - sum log p (b)| / "
           "continuation tokens, in nats/token; a GFLOP/s = (a)'s useful FLOPs "
           "(2·N_layer-matrices·T + 2·d·V·T_logits + 4·n_layers·(heads·head_dim)·attended keys) over its "
           "seconds; % peak = against the best 2048×2048 float32 `torch.matmul` of the same run. Each "
           "figure is, per document, the fastest repetition, summed over the depth's documents; the three "
           "methods run one after another on each document (a, b, c), so they see the same machine load.",
           ""]
    for mode in ("full", "quick"):
        res = all_results.get(mode)
        if not res:
            continue
        m = res["machine"]
        out += [f"### {mode.capitalize()} run", "",
                f"Command: `{res['command']}`  ", f"Date: {res['date']}  ",
                f"Machine: {m['cpu']} ({m['logical_cpus']} logical CPUs, torch threads {m['torch_threads']}), "
                f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
                f"lm-eval {m['lm_eval']}  ",
                f"Clock: {res.get('clock', 'wall')} seconds; "
                f"lm-eval batch size: {res['lm_eval_batch_size']}; repetitions: {res['repetitions']}; "
                f"documents per depth: {res['documents_per_depth']}; naive (c) continuations per document: "
                f"{res['naive_continuations_per_document'] or 'all'}  ",
                f"Matmul peak (2048×2048 float32, best of {res['matmul'][0]['reps']}, start / end of run): "
                + " / ".join(f"{p['best_flops'] / 1e9:.1f}" for p in res["matmul"]) + " GFLOP/s  ",
                f"Wall time: {res['wall_seconds']:.0f} s"
                + (f"; load average (1 min) start / end: {res['load_average']['start'][0]:.2f} / "
                   f"{res['load_average']['end'][0]:.2f}; niceness {res['niceness']}" if "load_average" in res else ""),
                "",
                "Report continuations only (7 per document):", "",
                fmt_table(res["depths"]), ""]
        if all("full_set" in r for r in res["depths"]):
            out += ["Full per-document branch set (report: 7 continuations; recall: 2; forced choice: \"A\" and "
                    "\"B\" as continuations of the forced-choice document; 11 requests on three contexts). (a): one "
                    "prefill of the three branches' common prefix, then every branch prompt and continuation in "
                    "one packed pass (`run_engine_full`); (b): the same 11 (context, continuation) strings through "
                    "`HFLM.loglikelihood` in one call. Same documents, timed right after the report-only runs:", "",
                    fmt_full(res["depths"]), ""]
        if res.get("clock") == "cpu":
            out += ["Clock `cpu`: every method's seconds are the process's CPU seconds (one thread), so "
                    "tok/s and the a/b, a/c ratios compare work; the GFLOP/s and % peak columns set CPU "
                    "seconds against a matmul peak timed by wall clock on the loaded machine and are not "
                    "meaningful in this run.", ""]
        out += [
                f"Last line: `{res['last_line']}`", "",
                "Where (a)'s time goes (first document of each depth, measured once after the timed "
                "runs, wall clock): its prefill, its packed continuation pass, and one full forward with full "
                "log-softmax of context + continuation (the unit of work (b) and (c) repeat per "
                "continuation). lm-eval's one-token logits cache also merges identical requests, so it "
                "runs one forward per *distinct* continuation; ceiling = distinct × full forward / "
                "(prefill + continuation pass), the a/b ratio these parts predict.", "",
                fmt_breakdown(res["depths"]), ""]
        deep = [r for r in res["depths"] if r["depth_tokens"] >= 1024]
        if deep:
            worst = min(r["ratio_a_over_b"] for r in deep)
            diff = max(r["max_abs_diff_a_b"] for r in res["depths"])
            verdict = ("meets" if worst >= 5 and diff <= 1e-3 else "does NOT meet")
            out += [f"Conclusion ({mode}): at depths of 1,024 tokens and more the engine is "
                    f"{worst:.2f}x or more faster than lm-eval on report continuations (slowest ratio over those "
                    f"depths), and the largest score difference is {diff:.2e} nats/token: this {verdict} the "
                    f"first step's bar (at least 5x, at most 1e-3 nats/token).", ""]
            if all("full_set" in r for r in deep):
                worst_f = min(r["full_set"]["ratio_a_over_b"] for r in deep)
                diff_f = max(r["full_set"]["max_abs_diff_a_b"] for r in res["depths"])
                verdict_f = "meets" if worst_f >= 8 and diff_f <= 1e-4 else "does NOT meet"
                out += [f"On the full branch set the engine is {worst_f:.2f}x or more faster than lm-eval at "
                        f"1,024 tokens and more, largest difference {diff_f:.2e} nats/token: this {verdict_f} the "
                        f"second step's goal (at least 8x, within 1e-4 nats/token).", ""]
    out += [gpu_note()]
    return "\n".join(out)


NOTES_MARKER = "<!-- Hand-written notes below this line are kept when scoring.py regenerates this file. -->"


def write_markdown(all_results: dict) -> None:
    kept = ""
    if RESULTS_MD.is_file():
        old = RESULTS_MD.read_text()
        if NOTES_MARKER in old:
            kept = old.split(NOTES_MARKER, 1)[1]
    RESULTS_MD.write_text(render_markdown(all_results) + "\n" + NOTES_MARKER + (kept or "\n"))


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="depths 1,024 and 2,048, one document each (< 3 min)")
    ap.add_argument("--docs", type=int, help="documents per depth (default: full 3, quick 1)")
    ap.add_argument("--reps", type=int, help="timed repetitions per depth (default 1)")
    ap.add_argument("--depths", help="comma-separated depth labels to run (of 128,512,1024,2048)")
    ap.add_argument("--lm-eval-batch-size", type=int, default=1,
                    help="HFLM batch_size (default 1, lm-eval's default; see RESULTS.md for others)")
    ap.add_argument("--naive-continuations", type=int,
                    help="continuations per document for (c) (default: all; quick: 2)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave results/ and RESULTS.md alone")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"torch threads (default {THREADS})")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time methods by wall seconds (default) or by the process's CPU seconds (use with "
                         "--threads 1 on a loaded machine)")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    mode = "quick" if args.quick else "full"
    plan = QUICK_DEPTHS if args.quick else FULL_DEPTHS
    if args.depths:
        wanted = {int(x) for x in args.depths.split(",")}
        plan = [p for p in FULL_DEPTHS if p[0] in wanted]
    n_docs = args.docs or (1 if args.quick else 3)
    reps = args.reps or 1
    naive_limit = args.naive_continuations if args.naive_continuations is not None else (2 if args.quick else None)
    naive_limit = naive_limit or None

    torch.set_num_threads(args.threads)
    # Wall seconds by default; on a shared, oversubscribed machine the process's CPU seconds
    # (with one thread, so no OpenMP spin-waiting is counted) measure the work itself.
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    warnings.filterwarnings("ignore")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        import lm_eval
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        print(f"lm-evaluation-harness is not installed; run: {INSTALL}", file=sys.stderr)
        return 2
    import transformers

    load_start = os.getloadavg()
    peak_start = matmul_peak()
    settings = load_settings()
    bank = load_bank(DEFAULT_BANK_DIR, settings)
    spec = registry(settings, EMBEDDED)["tested"]
    model, tokenizer = load_model(spec, device="cpu")
    model.eval()
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    engine = TeacherForcedEngine(model)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.lm_eval_batch_size)
    dims = model_dims(model)

    docs = select_documents(settings, bank, tokenizer, plan, n_docs)
    tokenize(docs, encode)
    longest = max(len(d.context_ids) + len(c) for ds in docs.values() for d in ds for c in d.continuation_ids)
    if lm.max_length < longest:
        raise SystemExit(f"lm-eval max_length {lm.max_length} < longest request {longest}: it would truncate")
    # Identical token splits: the engine's encode_pair == lm-eval's _encode_pair on every request.
    checked = 0
    for ds in docs.values():
        for d in ds:
            for c, ids in zip(d.continuations, d.continuation_ids):
                ctx_b, cont_b = lm._encode_pair(d.context, c)
                if ctx_b != d.context_ids or cont_b != ids:
                    raise SystemExit(f"{d.trial_id}: lm-eval splits {c!r} differently from encode_pair")
                checked += 1
            for b, (context, conts) in d.branches.items():
                ctx_ids, cont_ids = d.branch_ids[b]
                for c, ids in zip(conts, cont_ids):
                    ctx_b, cont_b = lm._encode_pair(context, c)
                    if ctx_b != ctx_ids or cont_b != ids:
                        raise SystemExit(f"{d.trial_id}: lm-eval splits {b} {c!r} differently from encode_pair")
                    checked += 1
    print(f"# {mode}: {sum(len(v) for v in docs.values())} documents, {checked} requests; token splits "
          f"identical to lm-eval's on all {checked}", flush=True)

    # Warm-up: every method once on a short request.
    first = next(iter(docs.values()))[0]
    warm = Document("warm-up", first.family, first.depth_key, first.context[:400].rstrip(),
                    first.continuations[:2], first.labels[:2])
    tokenize({0: [warm]}, encode)
    run_engine(engine, encode, [warm])
    run_lm_eval(lm, [warm], Instance)
    run_naive(model, encode, [warm], None)

    rows = []
    for label, family_key, depth_index in plan:
        ds = docs[label]
        # Side by side per document: a, b, c one after another, repeated; per document and
        # method the fastest repetition is kept, and a depth's time is the sum over its documents.
        times = {"a": [], "b": [], "c": [], "af": [], "bf": []}  # per document: [seconds of each repetition]
        a, b, c, af, bf = [], [], [], [], []
        for d in ds:
            per = {"a": [], "b": [], "c": [], "af": [], "bf": []}
            for _ in range(reps):
                t = clock(); sa = run_engine(engine, encode, [d]); per["a"].append(clock() - t)
                t = clock(); sb = run_lm_eval(lm, [d], Instance); per["b"].append(clock() - t)
                t = clock(); sc = run_naive(model, encode, [d], naive_limit); per["c"].append(clock() - t)
                # The full branch set (report, recall, forced choice) of the same document.
                t = clock(); saf = run_engine_full(engine, encode, [d]); per["af"].append(clock() - t)
                t = clock(); sbf = run_lm_eval_full(lm, [d], Instance); per["bf"].append(clock() - t)
            a += sa; b += sb; c += sc; af += saf; bf += sbf
            for k in per:
                times[k].append(per[k])
        a_for_c = [s for d, off in zip(ds, _offsets(ds)) for s in a[off: off + len(d.continuations)][:naive_limit or None]]
        n_req = request_tokens(ds)
        n_req_c = request_tokens(ds, naive_limit)
        flops, processed = engine_flops(dims, ds)
        best = {k: sum(min(r) for r in v) for k, v in times.items()}
        row = {
            "depth_tokens": label, "family": family_key, "depth_key": f"d{depth_index}",
            "trial_ids": [d.trial_id for d in ds], "documents": len(ds),
            "continuations": sum(len(d.continuations) for d in ds),
            "context_tokens": [len(d.context_ids) for d in ds],
            "continuation_tokens": sum(len(c) for d in ds for c in d.continuation_ids),
            "request_tokens": n_req,
            "a": {"seconds": best["a"], "tokens_per_s": n_req / best["a"], "seconds_per_document_per_rep": times["a"],
                  "decoder_tokens": processed, "flops": flops},
            "b": {"seconds": best["b"], "tokens_per_s": n_req / best["b"], "seconds_per_document_per_rep": times["b"]},
            "c": {"seconds": best["c"], "tokens_per_s": n_req_c / best["c"], "seconds_per_document_per_rep": times["c"],
                  "continuations": len(a_for_c), "request_tokens": n_req_c},
            "max_abs_diff_a_b": max_diff_per_token(a, b),
            "max_abs_diff_a_c": max_diff_per_token(a_for_c, c),
            "greedy_agree_a_b": all(x[2] == y[2] for x, y in zip(a, b)),
            "n_tokens_agree_a_b": all(x[1] == y[1] for x, y in zip(a, b)),
        }
        n_full = sum(len(ctx) + len(x) for d in ds for ctx, conts in d.branch_ids.values() for x in conts)
        row["full_set"] = {
            "requests": len(af), "request_tokens": n_full,
            "distinct_requests_lm_eval": sum(len({(b, tuple(x)) for b, (_, conts) in d.branch_ids.items() for x in conts})
                                             for d in ds),
            "a": {"seconds": best["af"], "tokens_per_s": n_full / best["af"], "seconds_per_document_per_rep": times["af"]},
            "b": {"seconds": best["bf"], "tokens_per_s": n_full / best["bf"], "seconds_per_document_per_rep": times["bf"]},
            "ratio_a_over_b": best["bf"] / best["af"], "max_abs_diff_a_b": max_diff_per_token(af, bf),
            "greedy_agree_a_b": all(x[2] == y[2] for x, y in zip(af, bf)),
        }
        row["breakdown"] = breakdown(engine, model, ds[0])
        row["ratio_a_over_b"] = row["a"]["tokens_per_s"] / row["b"]["tokens_per_s"]
        row["ratio_a_over_c"] = row["a"]["tokens_per_s"] / row["c"]["tokens_per_s"]
        row["a_flops_per_s"] = flops / best["a"]
        rows.append(row)
        print(f"depth {label:>5}: a {best['a']:6.2f} s  b {best['b']:6.2f} s  c {best['c']:6.2f} s  "
              f"a/b {row['ratio_a_over_b']:5.2f}  a/c {row['ratio_a_over_c']:5.2f}  "
              f"max|a-b| {row['max_abs_diff_a_b']:.2e}  |  full set: a {best['af']:6.2f} s  b {best['bf']:6.2f} s  "
              f"a/b {row['full_set']['ratio_a_over_b']:5.2f}  max|a-b| {row['full_set']['max_abs_diff_a_b']:.2e}",
              flush=True)

    peak_end = matmul_peak()
    peak = max(peak_start["best_flops"], peak_end["best_flops"])
    for r in rows:
        r["a_fraction_of_peak"] = r["a_flops_per_s"] / peak
    deepest = max(rows, key=lambda r: r["depth_tokens"])
    max_diff = max(max(r["max_abs_diff_a_b"], r["full_set"]["max_abs_diff_a_b"]) for r in rows)
    last = (f"speedup_vs_lm_eval={deepest['ratio_a_over_b']:.2f} max_abs_diff={max_diff:.2e} "
            f"speedup_full_branch_set={deepest['full_set']['ratio_a_over_b']:.2f}")
    command = shlex.join([".venv/bin/python", "benchmarks/scoring.py", *(sys.argv[1:] if argv is None else argv)])
    result = {
        "mode": mode, "command": command, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_name(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "lm_eval": getattr(lm_eval, "__version__", "0.4.13")},
        "model": {"checkpoint": spec.checkpoint, "dtype": spec.dtype, "attn_implementation": spec.attn_implementation,
                  **dims},
        "lm_eval_batch_size": args.lm_eval_batch_size, "lm_eval_max_length": lm.max_length, "clock": args.clock,
        "repetitions": reps, "documents_per_depth": n_docs, "naive_continuations_per_document": naive_limit,
        "requests_checked_identical_split": checked,
        "matmul": [peak_start, peak_end], "matmul_peak_flops": peak,
        "load_average": {"start": load_start, "end": os.getloadavg()}, "niceness": os.nice(0),
        "depths": rows, "speedup_vs_lm_eval_deepest": deepest["ratio_a_over_b"], "max_abs_diff": max_diff,
        "speedup_full_branch_set_deepest": deepest["full_set"]["ratio_a_over_b"],
        "last_line": last, "wall_seconds": time.perf_counter() - started,
    }
    print()
    print(fmt_table(rows))
    print(fmt_full(rows))
    print(f"matmul peak {peak / 1e9:.1f} GFLOP/s; wall {result['wall_seconds']:.0f} s")
    if not args.no_write:
        RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
        all_results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.is_file() else {}
        all_results[mode] = result
        RESULTS_JSON.write_text(json.dumps(all_results, indent=2) + "\n")
        write_markdown(all_results)
    print(last)
    return 0


def _offsets(docs):
    off, out = 0, []
    for d in docs:
        out.append(off)
        off += len(d.continuations)
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
