"""Per-gradient cost of the registered primary model: one dataset (nutpie's compiled numba
logp) vs many datasets at once (PyMC's JAX graph of the same model, ``jax.vmap`` over the
outcome vector). The question it answers: does vectorising many datasets' chains into one
program cut the cost per gradient on this CPU? (Sampling itself is not run here.)

    nice -n 10 .venv/bin/python benchmarks/power_jax_gradient.py [--frames 50 --depths 8]

Needs ``jax`` (``pip install jax``; CPU build). Writes ``benchmarks/results/power_jax_gradient.json``.
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
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    import pytensor
    import pytensor.tensor as pt
    from pymc.sampling.jax import get_jaxified_graph

    from fear_assets.models.primary_model import Priors, build_model
    from fear_assets.core.settings import load_settings
    from power import datasets  # benchmarks/power.py's generator

    settings = load_settings()
    design, _, data = datasets(settings, args.frames, args.depths, max(args.batch))
    model = build_model(data[0], Priors.from_settings(settings))
    # The model's own log density with its outcome data replaced by an input: same graph, same priors.
    y_shared = model["y"]
    y_in = pt.vector("y_in")
    logp = model.logp(jacobian=True)
    logp = pytensor.graph.replace.graph_replace(logp, {y_shared: y_in}, strict=False)
    value_vars = model.value_vars
    fn = get_jaxified_graph(inputs=[*value_vars, y_in], outputs=[logp])
    point = model.initial_point()
    sizes = [np.asarray(point[v.name]).size for v in value_vars]
    shapes = [np.asarray(point[v.name]).shape for v in value_vars]

    def unflatten(x):
        out, i = [], 0
        for n, sh in zip(sizes, shapes):
            out.append(x[i:i + n].reshape(sh))
            i += n
        return out

    def lp(x, y):
        return fn(*unflatten(x), y)[0]

    grad = jax.jit(jax.value_and_grad(lp))
    vgrad = jax.jit(jax.vmap(jax.value_and_grad(lp)))
    dim = sum(sizes)
    rng = np.random.default_rng(0)
    out = {"rows": design.rows, "dim": dim, "load": os.getloadavg(), "jax": jax.__version__, "per_gradient_s": {}}
    # one dataset, JAX
    x = jnp.asarray(rng.normal(0, 0.1, dim))
    y = jnp.asarray(data[0].y)
    jax.block_until_ready(grad(x, y))
    t = time.perf_counter()
    for _ in range(args.reps):
        jax.block_until_ready(grad(x, y))
    out["per_gradient_s"]["jax_single"] = (time.perf_counter() - t) / args.reps
    for k in args.batch:
        X = jnp.asarray(rng.normal(0, 0.1, (k, dim)))
        Y = jnp.asarray(np.stack([d.y for d in data[:k]]))
        jax.block_until_ready(vgrad(X, Y))
        t = time.perf_counter()
        for _ in range(max(3, args.reps // k)):
            jax.block_until_ready(vgrad(X, Y))
        per_call = (time.perf_counter() - t) / max(3, args.reps // k)
        out["per_gradient_s"][f"jax_vmap_{k}"] = per_call / k  # per dataset-gradient
    out["compare_with"] = ("nutpie's numba gradient of the same model: benchmarks/fit.py reports sampling "
                           "ms per gradient (results/fit.json)")
    out["load_after"] = os.getloadavg()
    path = ROOT / "benchmarks" / "results" / "power_jax_gradient.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing = existing if "rows" not in existing else {}  # an old single-run file
    existing[f"{args.frames}frames_x_{args.depths}depths"] = out
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
