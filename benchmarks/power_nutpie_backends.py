"""nutpie's numba and JAX backends on the same registered-size dataset, side by side in one run:
sampling seconds per gradient evaluation (the registered model, priors and sampler settings
unchanged; only the compiled backend differs). Writes benchmarks/results/power_nutpie_backends.json.

    nice -n 10 .venv/bin/python benchmarks/power_nutpie_backends.py [--frames 50 --depths 8 --draws 100 --tune 100]
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--depths", type=int, default=8)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--tune", type=int, default=100)
    args = ap.parse_args()
    import nutpie

    from fear_assets.models.primary_model import Priors, build_model, one_blas_thread
    from fear_assets.core.settings import load_settings
    from power import datasets

    settings = load_settings()
    design, _, data = datasets(settings, args.frames, args.depths, 1)
    out = {"rows": design.rows, "draws": args.draws, "tune": args.tune, "load_before": os.getloadavg(), "arms": {}}
    for backend in ("numba", "jax"):
        model = build_model(data[0], Priors.from_settings(settings))
        t, c = time.perf_counter(), time.process_time()
        compiled = nutpie.compile_pymc_model(model, backend=backend, gradient_backend="jax" if backend == "jax" else "pytensor")
        compile_s = time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        with one_blas_thread():
            idata = nutpie.sample(compiled, draws=args.draws, tune=args.tune, chains=2, seed=7, progress_bar=False,
                                  low_rank_modified_mass_matrix=True)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        grads = int(idata.sample_stats["n_steps"].sum()) + (int(idata.warmup_sample_stats["n_steps"].sum())
                                                           if "warmup_sample_stats" in idata.groups() else 0)
        out["arms"][backend] = {"compile_s": compile_s, "sampling_wall_s": wall, "sampling_cpu_s": cpu,
                                "gradients": grads, "wall_ms_per_gradient": 1000 * wall / grads,
                                "cpu_ms_per_gradient": 1000 * cpu / grads}
        print(backend, out["arms"][backend], flush=True)
    out["load_after"] = os.getloadavg()
    a = out["arms"]
    out["cpu_per_gradient_numba_over_jax"] = a["numba"]["cpu_ms_per_gradient"] / a["jax"]["cpu_ms_per_gradient"]
    (ROOT / "benchmarks" / "results" / "power_nutpie_backends.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
