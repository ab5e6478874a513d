"""How the power validation's HDI-endpoint MCSE behaves when both runs are correct: two
independent runs of one known distribution (stationary AR(1) draws, mapped to a normal, a t with
4 degrees of freedom or a lognormal), 4 x 500 draws (the candidate's) against 4 x 4,000 (the
reference's), scored as ``validation.compare_runs`` scores a 99% HDI endpoint: z = (a - b) /
sqrt(MCSE_a^2 + MCSE_b^2). Under a calibrated MCSE the z-scores have SD 1 and |z| > 3 in 0.27%
of runs; their mean is the HDI's own small-sample bias (fewer draws give a narrower interval).
Three rules side by side: a quantile's MCSE at the endpoint's share (ArviZ's estimator, the rule before 2026-12-05) and ``diagnostics.mcse_hdi`` (a block bootstrap of the
whole HDI, the rule since 2026-12-05), and that bootstrap against the reference's endpoints at the
candidate's length (``diagnostics.hdi_at_length``, the rule since later on 2026-12-05).

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hdi_mcse_null.py --runs 150

Writes benchmarks/results/hdi_mcse_null.json; last line
``max_rms_z_at_length=<x> max_rms_z_bootstrap=<y> max_rms_z_quantile=<z>`` (the largest root mean
square z over the cases: 1 when calibrated and unbiased).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import norm, t as student_t

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fear_assets.simulation import diagnostics as dg  # noqa: E402

SHAPES = {"normal": lambda z: z, "t4": lambda z: student_t.ppf(norm.cdf(z), 4), "lognormal": lambda z: np.exp(0.5 * z)}


def ar1(rng: np.random.Generator, chains: int, n: int, rho: float) -> np.ndarray:
    z = np.empty((chains, n))
    z[:, 0] = rng.normal(size=chains)
    e = rng.normal(size=(chains, n)) * np.sqrt(1 - rho ** 2)
    for t in range(1, n):
        z[:, t] = rho * z[:, t - 1] + e[:, t]
    return z


def quantile_mcse_z(a: np.ndarray, b: np.ndarray, prob: float) -> tuple[float, float]:
    """The HDI endpoints' z of runs ``a`` against ``b`` (chains, draws) with a quantile's MCSE at
    each endpoint's share (ArviZ's estimator; the validation's rule before 2026-12-05)."""
    ends = [dg.hdi(x, prob) for x in (a, b)]
    return tuple((ends[0][i] - ends[1][i]) / np.hypot(*(dg.mcse_quantile(x, float(np.mean(x <= e[i])))
                                                        for x, e in zip((a, b), ends))) for i in (0, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=150, help="pairs of runs per case")
    ap.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 0.8])
    ap.add_argument("--seed", type=int, default=20261014)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hdi_mcse_null.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    cases = []
    for rho in args.rho:
        for name, shape in SHAPES.items():
            zq, zb, zl = [], [], []
            for _ in range(args.runs):
                a, b = shape(ar1(rng, 4, 500, rho)), shape(ar1(rng, 4, 4000, rho))
                ends = [dg.hdi(x, 0.99) for x in (a, b)]
                boot = [dg.mcse_hdi(x, 0.99, rng) for x in (a, b)]
                at = dg.hdi_at_length(b, 0.99, a.shape[1], rng)
                zq.extend(quantile_mcse_z(a, b, 0.99))
                for i, end in enumerate(("hdi_low", "hdi_high")):
                    zb.append((ends[0][i] - ends[1][i]) / np.hypot(boot[0][i], boot[1][i]))
                    zl.append((ends[0][i] - at[end]) / np.hypot(boot[0][i], at[f"mcse_{end}"]))
            zq, zb, zl = (np.array(z).reshape(-1, 2) for z in (zq, zb, zl))
            case = {"rho": rho, "shape": name, "runs": args.runs,
                    **{k: {"sd_z": z.std(axis=0).round(3).tolist(), "mean_z": z.mean(axis=0).round(3).tolist(),
                           "rms_z": np.sqrt((z ** 2).mean(axis=0)).round(3).tolist(),
                           "share_abs_z_over_3": float(np.mean(np.abs(z) > 3))}
                       for k, z in (("quantile", zq), ("bootstrap", zb), ("bootstrap_at_length", zl))}}
            cases.append(case)
            print(f"[{time.perf_counter() - t0:.0f} s] rho {rho} {name}: SD of z (low, high end) quantile "
                  f"{case['quantile']['sd_z']} bootstrap {case['bootstrap']['sd_z']} at length "
                  f"{case['bootstrap_at_length']['sd_z']}; mean z bootstrap {case['bootstrap']['mean_z']} at length "
                  f"{case['bootstrap_at_length']['mean_z']}", flush=True)
    res = {"what": "HDI-endpoint z of two correct runs (4 x 500 vs 4 x 4,000 draws); benchmarks/hdi_mcse_null.py",
           "command": " ".join(sys.argv), "cases": cases, "seconds": time.perf_counter() - t0}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    rms = {k: max(max(c[k]["rms_z"]) for c in cases) for k in ("bootstrap_at_length", "bootstrap", "quantile")}
    print(f"max_rms_z_at_length={rms['bootstrap_at_length']:.2f} max_rms_z_bootstrap={rms['bootstrap']:.2f} "
          f"max_rms_z_quantile={rms['quantile']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
