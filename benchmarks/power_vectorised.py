"""Candidate fitting path for the power simulation: many datasets' chains in one JAX program
(``fear_assets.simulation.vectorised``: PyMC's JAX graph of the registered model, BlackJAX NUTS
vmapped over datasets x chains, mass matrix and step size warm-started from a reference fit),
side by side with nutpie's compile-once ``with_data`` loop (path (c)) on the same datasets.

    nice -n 10 .venv/bin/python benchmarks/power_vectorised.py --frames 10 --depths 2 --datasets 4

Figures: wall seconds per dataset (compilation/JIT and the reference adaptation reported
apart), the H2 contrast's min(bulk, tail) ESS, seconds to ESS 400, divergences, gradient
evaluations per dataset, and the largest |99% HDI endpoint| difference of H1-H3 between the
two paths. Writes ``benchmarks/results/power_vectorised.json``. No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--depths", type=int, default=2)
    ap.add_argument("--datasets", type=int, default=4)
    ap.add_argument("--adapt", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--c-datasets", type=int, help="fit only the first N datasets with (c) (its per-dataset mean)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fear_assets.models.primary_model import Fitter, Priors, build_model, cell_means, hypotheses, posterior_draws
    from fear_assets.core.settings import load_settings
    from fear_assets.simulation.vectorised import VectorisedNUTS
    from power import datasets, stats

    settings = load_settings()
    sampler = settings.sampler
    draws, tune, chains = int(sampler.draws), int(sampler.tune), int(sampler.chains)
    hdi = float(settings.decision.hdi_prob)
    priors = Priors.from_settings(settings)
    design, warm, data = datasets(settings, args.frames, args.depths, args.datasets)
    band = list(design.band)
    out = {"frames": args.frames, "depths": args.depths, "rows": design.rows, "datasets": args.datasets,
           "load_before": os.getloadavg(), "sampler": {"draws": draws, "tune": tune, "chains": chains}}
    log = lambda m: print(m, flush=True)  # noqa: E731

    # (c) nutpie compile once + with_data, registered settings
    fitter = Fitter(priors, draws, tune, chains, cache=[])  # compiled and timed in this arm
    t = time.perf_counter()
    fitter.fit(warm, 1)
    out["c_compile_and_first_fit_s"] = time.perf_counter() - t
    c = []
    for i, d in enumerate(data[:args.c_datasets or len(data)]):
        t = time.perf_counter()
        idata = fitter.fit(d, 1000 + i)
        wall = time.perf_counter() - t
        h = {k: np.asarray(v).reshape(chains, -1) for k, v in hypotheses(cell_means(
            d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)).items()}
        c.append({"wall_s": wall, "contrasts": stats(h, hdi),
                  "divergences": int(idata.sample_stats["diverging"].values.sum()),
                  "gradients": int(idata.sample_stats["n_steps"].values.sum())})
        log(f"c dataset {i}: {wall:.1f} s")

    # (v) vectorised BlackJAX NUTS
    t = time.perf_counter()
    v = VectorisedNUTS(build_model(warm, priors))
    out["v_jaxify_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ref = v.reference(warm.y, 1, args.adapt, chains, dense=args.dense)
    out["v_reference_adapt_s"] = time.perf_counter() - t
    Y = np.stack([d.y for d in data])
    t = time.perf_counter()
    v.fit_many(Y, ref, 2, args.warmup, draws)
    out["v_first_call_s"] = time.perf_counter() - t  # JIT + one run
    t = time.perf_counter()
    res = v.fit_many(Y, ref, 3, args.warmup, draws)
    v_total = time.perf_counter() - t
    vec = []
    for k, d in enumerate(data):
        beta = res["beta"][k].reshape(-1, res["beta"].shape[-1])
        h = {n: x.reshape(chains, -1) for n, x in hypotheses(cell_means(d, beta, res["intercept"][k].reshape(-1),
                                                                        band)).items()}
        vec.append({"wall_s": v_total / len(data), "contrasts": stats(h, hdi),
                    "divergences": int(res["divergences"][k].sum()), "gradients": int(res["gradients"][k].sum())})

    def summary(fits):
        wall = float(np.mean([f["wall_s"] for f in fits]))
        ess = float(np.mean([min(f["contrasts"]["H2"]["ess_bulk"], f["contrasts"]["H2"]["ess_tail"]) for f in fits]))
        return {"wall_s": wall, "min_ess_h2": ess, "s_to_ess400": wall * 400 / ess,
                "divergences": int(sum(f["divergences"] for f in fits)),
                "gradients_per_dataset": float(np.mean([f["gradients"] for f in fits]))}

    out["c"], out["v"] = summary(c), summary(vec)
    out["v_step_size"] = float(res["step_size"].mean())
    out["v_over_c_speedup_at_equal_ess"] = out["c"]["s_to_ess400"] / out["v"]["s_to_ess400"]
    out["max_hdi_diff_v_vs_c"] = float(max(abs(a["contrasts"][h][e] - b["contrasts"][h][e]) for a, b in zip(vec, c)  # the datasets both fitted
                                           for h in ("H1", "H2", "H3") for e in ("hdi_low", "hdi_high")))
    out["load_after"] = os.getloadavg()
    out["fits"] = {"c": c, "v": vec}
    path = ROOT / "benchmarks" / "results" / "power_vectorised.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    out["c_datasets"] = len(c)
    existing[f"{args.frames}x{args.depths}_K{args.datasets}{'_dense' if args.dense else ''}"] = out
    path.write_text(json.dumps(existing, indent=2) + "\n")
    log(json.dumps({k: v for k, v in out.items() if k != "fits"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
