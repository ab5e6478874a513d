"""One log-density gradient of the registered primary model, mu row by row against mu per
distinct design row (``primary_model.design_cells``), side by side on the same data and points.

Run (from the repository root; the machine is shared, so at low priority, one BLAS thread):

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/gradient.py

Data: ``benchmarks/power.py``'s registered-size dataset (50 frames x 8 depths, 14,400 trials).
For each frame parametrisation, both forms are compiled with PyTensor's numba backend (what
nutpie samples), checked to give the same log density and gradient at the same random points
(largest absolute difference printed), and timed in alternation: ``--reps`` rounds of
``--calls`` calls each, the best round per form kept (the machine's noise only ever adds time).
Writes ``benchmarks/results/gradient.json``; the last line is
``gradient_speedup_non_centred=<x> gradient_speedup_centred=<y>``. No timing is asserted anywhere.
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

RESULTS_JSON = ROOT / "benchmarks" / "results" / "gradient.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--depths", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    import power
    from fear_assets.models.primary_model import PREDICTORS, Priors, build_model, primary_cells
    from fear_assets.core.settings import load_settings

    settings = load_settings()
    load = os.getloadavg()
    design, _, data = power.datasets(settings, args.frames, args.depths, 1)
    d = data[0]
    cells = primary_cells(d)
    priors = Priors.from_settings(settings)
    out = {"frames": args.frames, "depths": args.depths, "rows": int(len(d.y)), "fixed_columns": int(d.X.shape[1]),
           "distinct_rows": int(len(cells.X_cells)), "slope_patterns": int(len(cells.Z_patterns)),
           "load_before": load, "forms": {}}
    print(f"{len(d.y)} trials, {d.X.shape[1]} fixed columns; {len(cells.X_cells)} distinct rows apart from the "
          f"covariates, {len(cells.Z_patterns)} slope patterns; load {load}", flush=True)
    for frames in ("non_centred", "centred"):
        fns, args_at = {}, None
        for predictor in PREDICTORS:
            model = build_model(d, priors, frames=frames, predictor=predictor)
            logp = model.logp()
            t = time.perf_counter()
            fns[predictor] = pytensor.function(model.value_vars, [logp, *pt.grad(logp, model.value_vars)],
                                               mode="NUMBA")
            compile_s = time.perf_counter() - t
            if args_at is None:
                rng = np.random.default_rng(settings.master_seed)
                point = model.initial_point()
                args_at = [point[v.name] + 0.1 * rng.standard_normal(np.shape(point[v.name]))
                           for v in model.value_vars]
            out["forms"].setdefault(frames, {})[predictor] = {"compile_s": compile_s}
        results = {p: fns[p](*args_at) for p in PREDICTORS}
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(*results.values()))
        best = {p: float("inf") for p in PREDICTORS}
        for _ in range(args.reps):
            for p in PREDICTORS:  # alternate, so both forms see the same machine
                t = time.perf_counter()
                for _ in range(args.calls):
                    fns[p](*args_at)
                best[p] = min(best[p], (time.perf_counter() - t) / args.calls)
        for p in PREDICTORS:
            out["forms"][frames][p]["ms_per_gradient"] = best[p] * 1e3
        out["forms"][frames]["max_abs_diff"] = diff
        out["forms"][frames]["speedup"] = best["direct"] / best["cells"]
        print(f"{frames}: direct {best['direct'] * 1e3:.3f} ms, cells {best['cells'] * 1e3:.3f} ms per gradient "
              f"({best['direct'] / best['cells']:.2f}x); largest |difference| in log density and gradient {diff:.2e}",
              flush=True)
    out["load_after"] = os.getloadavg()
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(out, indent=2) + "\n")
    print(f"gradient_speedup_non_centred={out['forms']['non_centred']['speedup']:.2f} "
          f"gradient_speedup_centred={out['forms']['centred']['speedup']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
