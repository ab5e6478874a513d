"""The vectorised fitting path (``fear_assets.simulation.vectorised``) on a GPU, at the
registered size (50 frames x 8 depths, 14,400 rows, primary block), for a machine WITHOUT PyMC.

Two steps:

    # here (PyMC): the registered model's log density exported for cpu and cuda, the outcomes
    nice -n 10 .venv/bin/python benchmarks/power_gpu.py export --frames 50 --depths 8 --datasets 256
    # on the device (numpy, scipy, jax, blackjax only; reads .gpu_power/)
    python benchmarks/power_gpu.py run --platform cuda --datasets 64 256 --max-seconds 270

``export`` builds the registered design (``benchmarks/power.py``'s ``datasets``: scenario
``meaningful``, seeds from the registered master seed), turns ``build_model`` into PyMC's JAX
log density of (unconstrained parameters, outcome vector), checks it against PyMC's own
``compile_logp``/``compile_dlogp``, and writes ``.gpu_power/``: ``logdensity.jaxexport.gz``
(``jax.export``, serialized and gzipped, batch dimension symbolic, lowered for cpu and cuda), ``arrays.npz`` (start
point, kept indices, the reference dataset's outcomes in float64, K datasets' outcomes in
float32 to keep the folder small: the device fits those rounded outcomes, exact in float64;
the H1-H3 contrasts as weights on the kept draws) and ``manifest.json`` (rows, dim, seeds,
registered sampler and convergence settings, settings sha256).

``run`` times (a) one dataset's value-and-gradient, (b) vmapped value-and-gradient at several
batch sizes (ms per dataset-gradient), (c) the reference adaptation (BlackJAX window
adaptation on the reference dataset), (d) ``fit_kept`` on K datasets x chains (warm-up with the
reference's mass matrix, then the registered number of draws), with JIT/compile seconds apart;
per K: wall s per dataset, gradients per dataset, divergences, step size, the H2 contrast's
min(bulk, tail) ESS and R-hat (``fear_assets.simulation.diagnostics``, no ArviZ), s to ESS 400,
datasets per hour at ESS 400, fits failing the registered convergence rule (counted, never
dropped). Results go to ``$OUT/power_gpu.json`` (else ``benchmarks/results/power_gpu.json``),
rewritten after every step so a killed run keeps what it measured; ``--max-seconds`` skips a
step whose projected time would pass it. The sampler modules are loaded by file path, so
``fear_assets/__init__`` (and its imports) never runs on the device.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ART = ROOT / ".gpu_power"
#: Where reference attempts and SBC batches are kept and read back (``kept_or_fitted``).
REFERENCE_CACHE = ROOT / "data" / "cache" / "power_validation"
EXPORT_FILE = "logdensity.jaxexport.gz"
#: The unregistered candidates with every dataset's own warm-up (``accelerated.ADAPTIVE_ALGORITHMS``,
#: named here because the device imports neither PyMC nor the package's model modules).
ADAPTIVE_CANDIDATES = ("adaptive_hmc", "adaptive_hmc_dense", "adaptive_hmc_dense_oas", "adaptive_hmc_dense_pooled")


def candidate_options(algorithm: str) -> dict:
    """What a candidate's name selects in ``BatchedAdaptiveHMC``, as ``accelerated.tune`` selects it:
    the block metric (``dense``: the export's ``dense_idx``), its shrinkage, one length for the batch."""
    return {"dense": algorithm.startswith("adaptive_hmc_dense"), "shrink_dense": algorithm.endswith("_oas"),
            "pool_length": algorithm.endswith("_pooled")}


import numpy as np  # noqa: E402


def _load(name: str):
    """A module of fear_assets/simulation by file path (no package __init__ imports)."""
    path = ROOT / "fear_assets" / "simulation" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"power_gpu_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


# -- export (needs PyMC) ----------------------------------------------------------------------
def contrast_weights(d, band, keep_sizes) -> tuple[np.ndarray, np.ndarray, list]:
    """H1-H3 as an affine map of the kept vector [intercept, beta]: H = kept @ W + c. Exact:
    ``cell_means`` and ``hypotheses`` are linear in (intercept, beta); checked on random draws."""
    from fear_assets.models.primary_model import cell_means, hypotheses

    n = sum(keep_sizes)
    basis = np.vstack([np.zeros(n), np.eye(n)])

    def H(kept):
        h = hypotheses(cell_means(d, kept[:, 1:], kept[:, 0], band))
        return list(h), np.stack([np.asarray(h[k]) for k in h], axis=1)

    names, hb = H(basis)
    c, W = hb[0], hb[1:] - hb[0]
    test = np.random.default_rng(0).normal(size=(7, n))
    if not np.allclose(H(test)[1], test @ W + c, atol=1e-10):
        raise RuntimeError("the H1-H3 contrasts are not affine in (intercept, beta): power_gpu's weights do not apply")
    return W, c, names


def export(args) -> int:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fear_assets.models.primary_model import Priors, build_model
    from fear_assets.core.settings import load_settings
    from fear_assets.simulation.accelerated import dense_block_indices
    from fear_assets.simulation.vectorised import VectorisedNUTS, check_export, export_logdensity
    from power import datasets  # benchmarks/power.py's generator

    t0 = time.perf_counter()
    settings = load_settings()
    design, warm, data = datasets(settings, args.frames, args.depths, args.datasets)
    model = build_model(warm, Priors.from_settings(settings))
    v = VectorisedNUTS(model)
    t = time.perf_counter()
    blob = export_logdensity(v.logdensity, v.dim, design.rows, platforms=("cpu", "cuda"))
    export_s = time.perf_counter() - t
    rng = np.random.default_rng(settings.master_seed)
    points = v.x0 + rng.normal(0.0, 0.3, (args.check_points, v.dim))
    t = time.perf_counter()
    check = check_export(model, v.model, blob, warm.y, points)
    check_s = time.perf_counter() - t
    if max(check["logp_rel"], check["dlogp_rel"]) > 1e-8:
        raise RuntimeError(f"exported log density differs from PyMC's: {check}")
    W, c, names = contrast_weights(warm, list(design.band), [v.sizes[v.names.index(k)] for k in v.keep])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # gzip: the design's constants (indices, covariates) in the module compress ~9x
    (out / EXPORT_FILE).write_bytes(gzip.compress(blob, compresslevel=6, mtime=0))
    np.savez(out / "arrays.npz", x0=v.x0, keep_idx=v.keep_idx, y_ref=np.asarray(warm.y, dtype=np.float64),
             Y=np.stack([d.y for d in data]).astype(np.float32), contrast_W=W, contrast_c=c,
             dense_idx=dense_block_indices(v.names, v.sizes))
    sampler, conv = settings.sampler, settings.convergence
    manifest = {
        "what": "registered primary model log density (build_model) exported with jax.export; benchmarks/power_gpu.py",
        "frames": args.frames, "depths": args.depths, "rows": design.rows, "dim": v.dim, "datasets": args.datasets,
        "names": v.names, "sizes": v.sizes, "keep": list(v.keep), "contrasts": names, "scenario": "meaningful",
        "dataset_seeds": "runner.dataset_seed(master_seed, 'bench', 'meaningful', frames, i, 'primary'), i = -1 (reference), 0..K-1",
        "master_seed": settings.master_seed, "settings_sha256": settings.sha256,
        "sampler": {"draws": sampler.draws, "tune": sampler.tune, "chains": sampler.chains},
        "simulation_sampler": dict(vars(settings.simulation_sampler)),
        "convergence": {"rhat_max": conv.rhat_max, "ess_bulk_min": conv.ess_bulk_min, "ess_tail_min": conv.ess_tail_min,
                        "divergences_max": conv.divergences_max},
        "hdi_prob": settings.decision.hdi_prob,
        "Y_dtype": "float32 (cast to float64 on the device)", "platforms": ["cpu", "cuda"],
        "jax_export_version": __import__("jax").__version__, "export_s": export_s,
        "check_vs_pymc": {"points": args.check_points, "max_diff": check, "seconds": check_s},
        "export_sha256": hashlib.sha256(blob).hexdigest(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(json.dumps({**manifest, "folder_bytes": size, "total_s": time.perf_counter() - t0}, indent=1))
    print(f"exported rows={design.rows} dim={v.dim} datasets={args.datasets} bytes={size} "
          f"max_rel_diff_logp={check['logp_rel']:.1e} max_rel_diff_dlogp={check['dlogp_rel']:.1e} (abs {check['logp']:.1e}, {check['dlogp']:.1e})")
    return 0


# -- run (device: numpy, scipy, jax, blackjax) -------------------------------------------------
def _brief(v):
    """A result entry without its per-dataset lists (for the progress lines)."""
    return {k: _brief(x) for k, x in v.items() if not isinstance(x, list)} if isinstance(v, dict) else v


def hdi_differences(short: np.ndarray, long: np.ndarray, contrasts: list, prob: float, diag) -> dict:
    """Largest |99% HDI endpoint| difference between a registered-length fit and a long run of
    the same datasets, per contrast and overall; plus the long run's smallest ESS (its own
    Monte Carlo error bounds how small a difference can be shown). Arrays: (K, chains, draws, contrasts)."""
    per = {}
    for j, name in enumerate(contrasts):
        diffs = [max(abs(a - b) for a, b in zip(diag.hdi(short[k, :, :, j], prob), diag.hdi(long[k, :, :, j], prob)))
                 for k in range(short.shape[0])]
        per[name] = {"max_abs_endpoint_diff": float(max(diffs)), "median": float(np.median(diffs)),
                     "reference_min_ess": float(min(min(diag.ess_bulk(long[k, :, :, j]), diag.ess_tail(long[k, :, :, j]))
                                                    for k in range(long.shape[0]))),
                     "posterior_sd_mean": float(long[..., j].std(axis=(1, 2)).mean())}
    return {"per_contrast": per, "max_abs_endpoint_diff": max(v["max_abs_endpoint_diff"] for v in per.values())}


def jax_on(platform: str | None):
    """JAX in float64 on ``platform`` (JAX_PLATFORMS: cuda, cpu; None: JAX's choice): the module,
    its devices and the seconds their backend took to start."""
    if platform:
        os.environ["JAX_PLATFORMS"] = platform
    import jax

    jax.config.update("jax_enable_x64", True)
    t = time.perf_counter()
    devices = jax.devices()
    return jax, devices, time.perf_counter() - t


def registered_sampler(manifest: dict, art: Path, fields: tuple[str, ...], exporter: str) -> dict:
    """The registered ``simulation_sampler`` an export was made under (its manifest): a device
    reads its defaults there, not from the package's settings, which it cannot load. Refuses an
    export that lacks any of ``fields`` (made before they were registered), naming ``exporter``."""
    s = manifest.get("simulation_sampler") or {}
    lacking = [k for k in fields if k not in s]
    if lacking:
        raise SystemExit(f"{art}/manifest.json: its simulation_sampler lacks {lacking} (exported before they were "
                         f"registered): export again with `{exporter} export`")
    return s


def run(args) -> int:
    t_start = time.perf_counter()
    deadline = t_start + args.max_seconds
    jax, devices, backend_init_s = jax_on(args.platform)
    import jax.numpy as jnp

    vec, diag = _load("vectorised"), _load("diagnostics")
    art = Path(args.artefacts)
    missing = [n for n in ("manifest.json", "arrays.npz", EXPORT_FILE) if not (art / n).is_file()]
    if missing:
        raise SystemExit(f"{art}: {missing} missing; write them with `benchmarks/power_gpu.py export` where PyMC is "
                         f"installed and carry the folder (--artefacts names another one)")
    manifest = json.loads((art / "manifest.json").read_text())
    arr = np.load(art / "arrays.npz")
    # adaptive_hmc_dense[_oas]: the block metric, dense on the export's dense_idx; _oas: shrunk (OAS)
    opts = candidate_options(args.algorithm)
    dense_run, shrink = opts["dense"], opts["shrink_dense"]
    if dense_run and "dense_idx" not in arr.files:
        raise SystemExit(f"{art / 'arrays.npz'}: no dense_idx, which --algorithm {args.algorithm} needs (an export "
                         f"older than the block metric); export again with `benchmarks/power_gpu.py export`")
    Y_all = arr["Y"].astype(np.float64)
    y_ref, W, c = arr["y_ref"], arr["contrast_W"], arr["contrast_c"]
    draws = args.draws or manifest["sampler"]["draws"]
    chains = args.chains or manifest["sampler"]["chains"]
    conv = manifest["convergence"]
    target = conv["ess_bulk_min"]
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / args.json
    res = {"devices": [str(d) for d in devices], "device_kind": devices[0].device_kind, "backend_init_s": backend_init_s,
           "jax": jax.__version__,
           "blackjax": __import__("blackjax").__version__, "manifest": manifest,
           "settings": {"warmup": args.warmup, "draws": draws, "chains": chains, "adapt": args.adapt,
                        "target_accept": args.target_accept, "max_seconds": args.max_seconds},
           "skipped": [], "load_before": os.getloadavg()}

    def save(step, sub=None):
        """Rewrite the JSON (a killed run keeps every finished step) and print the new entry."""
        res["elapsed_s"] = time.perf_counter() - t_start
        path.write_text(json.dumps(res, indent=2) + "\n")
        entry = res.get(step) if sub is None else {sub: res[step][sub]}
        print(f"[{res['elapsed_s']:.1f} s] {step}: {json.dumps(_brief(entry), default=str)[:900]}", flush=True)

    def left():
        return deadline - time.perf_counter()

    # what this process imported: the device has none of these, so none may be needed
    res["imported_project_modules"] = sorted(m for m in ("fear_assets", "pymc", "pytensor", "arviz", "dagster", "duckdb")
                                             if m in sys.modules)
    t = time.perf_counter()
    ld = vec.exported_logdensity(gzip.decompress((art / EXPORT_FILE).read_bytes()))
    res["deserialise_s"] = time.perf_counter() - t
    dim, rows = manifest["dim"], manifest["rows"]
    rng = np.random.default_rng(manifest["master_seed"])

    # (a) one dataset's value and gradient
    g1 = jax.jit(jax.value_and_grad(ld))
    x = jnp.asarray(arr["x0"] + rng.normal(0, 0.1, dim))
    y = jnp.asarray(y_ref)
    t = time.perf_counter()
    g1c = g1.lower(x, y).compile()
    comp = time.perf_counter() - t
    jax.block_until_ready(g1c(x, y))
    t = time.perf_counter()
    for _ in range(args.reps):
        jax.block_until_ready(g1c(x, y))
    res["a_single_gradient"] = {"compile_s": comp, "ms": 1e3 * (time.perf_counter() - t) / args.reps}
    save("a_single_gradient")

    # (b) vmapped value and gradient (the path NUTS uses: custom_vmap -> the batched export)
    gb = jax.jit(jax.vmap(jax.value_and_grad(ld)))
    res["b_vmapped_gradient"] = {}
    call_ms = {}

    def time_batch(b):
        """ms of one vmapped value-and-gradient call over ``b`` datasets (compiled first)."""
        X = jnp.asarray(arr["x0"] + rng.normal(0, 0.1, (b, dim)))
        Yb = jnp.asarray(np.resize(Y_all, (b, rows)))
        t = time.perf_counter()
        gbc = gb.lower(X, Yb).compile()
        comp = time.perf_counter() - t
        jax.block_until_ready(gbc(X, Yb))
        reps = max(3, args.reps // max(1, b // 16))
        t = time.perf_counter()
        for _ in range(reps):
            jax.block_until_ready(gbc(X, Yb))
        call_ms[b] = 1e3 * (time.perf_counter() - t) / reps
        res["b_vmapped_gradient"][str(b)] = {"compile_s": comp, "ms_per_call": call_ms[b],
                                             "ms_per_dataset_gradient": call_ms[b] / b, "reps": reps}
        save("b_vmapped_gradient", str(b))

    for b in args.grad_batches:
        if left() < 20:
            res["skipped"].append(f"gradient batch {b}: {left():.0f} s left")
            continue
        time_batch(b)

    # (c) reference adaptation on the reference dataset
    tm = {}
    if args.algorithm == "chees_hmc":
        # jittered fixed-length HMC tuned once (ChEES) on pilot datasets (the last rows of Y), then frozen
        sampler = vec.BatchedChEES(ld, dim, arr["x0"], arr["keep_idx"])
        pilot = Y_all[-args.pilot_datasets:]
        ref = sampler.tune(pilot, manifest["master_seed"], args.adapt, chains, timings=tm)
        _fit = sampler.fit_kept
        sampler.fit_kept = lambda Y, r, seed, warmup, n, target_accept=None, timings=None: {  # noqa: E731
            **_fit(Y, r, seed, warmup, n, timings=timings), "step_size": np.full((len(Y), chains), r.step_size)}
    elif args.algorithm in ADAPTIVE_CANDIDATES:
        # every dataset adapts its own kernel in its warm-up (no reference step): a seeded cold start;
        # _dense: its mass matrix dense on the coordinates the export names (``dense_idx``: all but the unit intercepts)
        dense = arr["dense_idx"] if dense_run else None
        floor = (int(registered_sampler(manifest, art, ("min_pooled_chains",), "benchmarks/power_gpu.py")
                     ["min_pooled_chains"]) if opts["pool_length"] else 0)
        sampler = vec.BatchedAdaptiveHMC(ld, dim, arr["x0"], arr["keep_idx"], target_accept=args.target_accept,
                                         dense_idx=dense, shrink_dense=shrink, pool_length=opts["pool_length"],
                                         min_pooled_chains=floor)
        ref = vec.FrozenHMC.cold_start(arr["x0"], chains, manifest["master_seed"])
        tm = {"compile_s": 0.0, "run_s": 0.0}
        _fit_a = sampler.fit_kept

        def _with_steps(fit):
            return {**fit, "step_size": np.repeat(fit["adapted"].step_size[:, None], chains, axis=1)}

        sampler.fit_kept = lambda Y, r, seed, warmup, n, target_accept=None, timings=None: _with_steps(  # noqa: E731
            _fit_a(Y, r, seed, warmup, n, timings=timings))
    else:
        sampler = vec.BatchedNUTS(ld, dim, arr["x0"], arr["keep_idx"])
        ref = sampler.reference(y_ref, manifest["master_seed"], args.adapt, chains, dense=args.dense, timings=tm)
    res["c_reference"] = {**tm, "steps": args.adapt, "chains": chains, "step_size": ref.step_size,
                          "algorithm": args.algorithm,
                          "trajectory_length": getattr(ref, "trajectory_length", None),
                          "dense": args.dense or dense_run,
                          "dense_block_size": int(len(dense)) if dense_run else None,
                          "dense_shrinkage": "oas" if shrink else None,
                          "trajectory_length_pooled": opts["pool_length"]}
    save("c_reference")

    # (d) many datasets at once
    res["d_fit_many"] = {}

    def call_cost(batch):
        """Measured ms of one vmapped gradient call at ``batch``: timed now (seconds) when no
        batch that large was measured, since extrapolating linearly from a small batch
        overstates a GPU's cost many times over and would skip every fit."""
        if not any(b >= batch for b in call_ms) and left() > 30:
            time_batch(batch)
        if not call_ms:
            return float(batch)
        known = sorted(call_ms)
        big = min([b for b in known if b >= batch] or [known[-1]])
        return call_ms[big] * max(1.0, batch / big)

    def projected(K, n_draws=draws, prev=None):
        """Conservative seconds for fitting K datasets with ``n_draws`` draws: from ``prev`` (a
        measured fit; default the largest so far: its run scaled by the gradient call cost at
        K x chains vs its own, x1.3 for longer maximal trees among more chains, plus its
        compile x1.5); before any fit, from the reference adaptation's seconds per step (x2
        for the warm-up's and draws' trees)."""
        done = res["d_fit_many"]
        if prev is None and done:
            prev = done[max(done, key=int)]
        if prev is not None:
            scale = max(1.0, call_cost(K * chains) / call_cost(int(prev["K"]) * chains))
            return 1.5 * prev["compile_s"] + 1.3 * prev["run_s"] * scale * (args.warmup + n_draws) / (prev["warmup"] + prev["draws"])
        scale = max(1.0, call_cost(K * chains) / call_cost(chains))
        return 1.5 * tm["compile_s"] + 2.0 * tm["run_s"] / args.adapt * (args.warmup + n_draws) * scale

    fits_h: dict = {}  # K -> contrast draws of that fit (the reference comparison reads them)
    for K in args.datasets:
        K = min(K, len(Y_all))
        est = projected(K)
        if est > left():
            res["skipped"].append(f"fit K={K}: projected {est:.0f} s > {left():.0f} s left")
            save("skipped")
            continue
        tm_k = {}
        fit = sampler.fit_kept(Y_all[:K], ref, manifest["master_seed"] + K, args.warmup, draws,
                               args.target_accept, timings=tm_k)
        h = fit["kept"] @ W + c  # (K, chains, draws, contrasts)
        fits_h.setdefault(K, h)
        i2 = manifest["contrasts"].index("H2")
        ess = np.array([[diag.ess_bulk(h[k, :, :, j]), diag.ess_tail(h[k, :, :, j])] for k in range(K)
                        for j in [i2]])
        rh = np.array([diag.rhat(h[k, :, :, i2]) for k in range(K)])
        min_ess = ess.min(axis=1)
        per_ds = tm_k["run_s"] / K
        fails = ~((rh <= conv["rhat_max"]) & (ess[:, 0] >= conv["ess_bulk_min"]) & (ess[:, 1] >= conv["ess_tail_min"])
                  & (fit["divergences"].sum(axis=1) <= conv["divergences_max"]))  # a NaN fails
        s_ess = per_ds * target / min_ess.mean()
        res["d_fit_many"][str(K)] = {
            "K": K, "compile_s": tm_k["compile_s"], "run_s": tm_k["run_s"], "projected_s": est, "wall_s_per_dataset": per_ds,
            "gradients_per_dataset": float(fit["gradients"].sum(axis=1).mean()),
            "divergences_total": int(fit["divergences"].sum()), "step_size_mean": float(fit["step_size"].mean()),
            "h2_min_ess_mean": float(min_ess.mean()), "h2_min_ess_min": float(min_ess.min()),
            "h2_rhat_max": float(rh.max()), "h2_fails_convergence_rule": int(fails.sum()),
            "h_means_mean": dict(zip(manifest["contrasts"], map(float, h.mean(axis=(0, 1, 2))))),
            "s_to_ess400_per_dataset": s_ess, "datasets_per_hour_at_ess400": 3600.0 / s_ess,
            "warmup": args.warmup, "draws": draws, "chains": chains,
            "h2_min_ess_per_dataset": [round(float(e), 1) for e in min_ess],
            "h2_rhat_per_dataset": [round(float(r), 4) for r in rh],
            "divergences_per_dataset": fit["divergences"].sum(axis=1).tolist()}
        save("d_fit_many", str(K))
    if args.reference_draws and fits_h:
        # 6.3's keep rule for a candidate path: its 99% HDIs against a long run on the same datasets.
        K = min(fits_h)
        est = projected(K, args.reference_draws, prev=res["d_fit_many"][str(K)])
        if est > left():
            res["skipped"].append(f"reference run K={K} x {args.reference_draws} draws: projected {est:.0f} s > "
                                  f"{left():.0f} s left")
        else:
            tm_r = {}
            long = sampler.fit_kept(Y_all[:K], ref, manifest["master_seed"] + 10_000 + K, args.warmup,
                                    args.reference_draws, args.target_accept, timings=tm_r)
            hl = long["kept"] @ W + c
            res["e_reference_hdi"] = {"K": K, "draws": args.reference_draws, "chains": chains,
                                      "hdi_prob": manifest["hdi_prob"], **tm_r,
                                      **hdi_differences(fits_h[K], hl, manifest["contrasts"], manifest["hdi_prob"], diag),
                                      "reference_divergences": int(long["divergences"].sum())}
            save("e_reference_hdi")
    res["load_after"] = os.getloadavg()
    save("skipped")
    done = res["d_fit_many"]
    best = done[max(done, key=lambda k: int(k))] if done else None
    b_big = res["b_vmapped_gradient"].get(str(max(map(int, res["b_vmapped_gradient"]), default=0)), {})
    print(f"power_gpu: device={res['devices'][0]} rows={rows} grad_ms_single={res['a_single_gradient']['ms']:.3f} "
          f"grad_ms_per_dataset_at_b{max(call_ms, default=0)}={b_big.get('ms_per_dataset_gradient', float('nan')):.4f} "
          + (f"K={max(map(int, done))} s_per_dataset={best['wall_s_per_dataset']:.3f} "
             f"s_to_ess400={best['s_to_ess400_per_dataset']:.3f} datasets_per_hour_ess400={best['datasets_per_hour_at_ess400']:.0f} "
             f"fails_rule={best['h2_fails_convergence_rule']}" if best else "no fit_many run (none asked, or all skipped: see skipped)")
          + f" json={path}")
    return 0


# -- validate (here, with PyMC: item 3 of issue 28) --------------------------------------------
def _validation_estimates():
    """Pilot estimates of the benchmark (benchmarks/power.py's variance components), with
    H5's probit and the judge's scale so every block can be drawn."""
    from dataclasses import replace

    from power import estimates

    h5 = {"criterion_intercept": 0.0, "position": 0.1, "criterion_frame_sd": 0.2, "dprime": 1.0,
          "dprime_frame_sd": [0.2] * 6}
    base = estimates()
    # the four controls' condition effects and H4's probe scale: every block can be drawn
    controls = {"instructed_interaction": 0.3, "instructed_priority": 0.3, "marked_priority": 0.3,
                "addressee_name": 0.3}
    h4 = {**replace(base, sigma=0.1).as_dict(), "document_sd": 0.1}
    return replace(base, h5=h5, judge_sigma=0.25, controls=controls, h4=h4)


#: The reference's attempts, in order, while a run misses the convergence rule: (target
#: acceptance, frame form). nutpie's default, then smaller steps (the usual cure for
#: divergences), then, for a primary-model block, its frame effects in the OTHER form than the
#: registered rule picks ("other"): the posterior is the same model's, only sampled in other
#: coordinates, and a dataset near the rule's threshold can diverge in the form it got. A
#: reference that misses the rule makes its comparison void.
REFERENCE_ATTEMPTS = ((None, None), (0.95, None), (0.99, None), (None, "other"), (0.95, "other"))
#: The target acceptances of those attempts (recorded in the validation's JSON).
REFERENCE_TARGET_ACCEPT = tuple(dict.fromkeys(t for t, _ in REFERENCE_ATTEMPTS))


def reference_run(b, fitter, priors, h5_priors, draws: int, seed: int,
                  target_accept: float | None = None, form: str | None = None) -> tuple[dict, int]:
    """The long run of the registered sampler on one block of one dataset (nutpie, 4 chains x
    (1,000 + ``draws``); ``fitter``: a ``Fitter`` with those lengths and the registered frame
    rule; ``target_accept``: nutpie's, where not its default; ``form``: a primary-model block's
    frame form where not the rule's): the block's contrasts, each (4, draws), and the run's
    divergences (a comparison with a diverging reference rests on a biased or wide "truth")."""
    import copy

    from fear_assets.models.primary_model import one_blas_thread, sample

    options = {} if target_accept is None else {"target_accept": float(target_accept)}
    if b.kind == "h5" and options:
        import nutpie

        with one_blas_thread():
            idata = nutpie.sample(nutpie.compile_pymc_model(b.build(priors, h5_priors)), draws=draws, tune=1000,
                                  chains=4, seed=seed, progress_bar=False, low_rank_modified_mass_matrix=True,
                                  **options)
    elif b.kind == "h5":  # constant data: compiled per dataset, as the runner does
        idata = sample(b.build(priors, h5_priors), draws, 1000, 4, seed)
    else:
        if options or form is not None:
            fitter = copy.copy(fitter)
            if options:
                fitter.sample_options = lambda: options  # the same compiled model, smaller steps
            if form is not None:
                fitter.rule, fitter.frames = None, form  # the same posterior in the other coordinates
        idata = fitter.fit(b.data, seed)
    contrasts = {c: np.asarray(x).reshape(4, -1) for c, x in b.contrasts(idata).items()}
    return contrasts, int(np.asarray(idata.sample_stats["diverging"]).sum())


def source_digest(*globs: str) -> str:
    """sha256 of the source files matching ``globs`` (relative to the repository): a cached fit
    is reused only by the code that fitted it."""
    h = hashlib.sha256()
    for path in sorted({p for g in globs for p in ROOT.glob(g)}):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


#: The code a reference run depends on besides nutpie and PyMC: the models and how a block is drawn.
REFERENCE_SOURCES = ("fear_assets/models/*.py", "fear_assets/analysis/*.py", "fear_assets/simulation/blocks.py")
#: The code an SBC batch depends on: the accelerator path's sampler and programs, and the models.
SBC_SOURCES = ("fear_assets/simulation/vectorised.py", "fear_assets/simulation/accelerated.py",
               "fear_assets/models/*.py", "fear_assets/simulation/blocks.py")


def reference_key(b, fitter, priors, h5_priors, draws: int, seed: int, target_accept, form) -> str:
    """What one reference attempt depends on, as a sha256 prefix: the block's data and model
    kind, the priors, the fitter's frame rule, tuning and chains, the draws and seed, the
    attempt's target acceptance and frame form, the samplers' versions and the models' source
    (``REFERENCE_SOURCES``): a cached run is reused only where all agree."""
    import pickle

    import nutpie
    import pymc

    blob = pickle.dumps((b.block, b.kind, b.data, priors, fitter.priors, h5_priors, fitter.rule, fitter.tune,
                         fitter.chains, int(draws), int(seed), target_accept, form, nutpie.__version__,
                         pymc.__version__, source_digest(*REFERENCE_SOURCES)), protocol=5)
    return hashlib.sha256(blob).hexdigest()[:24]


def kept_or_fitted(path: Path | None, fit) -> tuple[dict, np.ndarray, bool]:
    """A fit's draws (name -> array) and divergences, read back from ``path`` where an earlier
    run kept them, else ``fit()``'s, then kept there (written whole, then renamed: never a half
    file; ``path`` None: not kept). Returns the draws, the divergences and whether they were
    read back: the one cache of ``validate``'s reference attempts and SBC batches."""
    if path is not None and path.exists():
        with np.load(path) as z:
            return {k.removeprefix("a:"): z[k] for k in z.files if k.startswith("a:")}, z["divergences"], True
    draws, divergences = fit()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.stem + ".partial.npz")
        np.savez(tmp, divergences=divergences, **{f"a:{k}": v for k, v in draws.items()})
        tmp.replace(path)
    return draws, np.asarray(divergences), False


def cached_reference_run(b, fitter, priors, h5_priors, draws: int, seed: int, target_accept, form,
                         cache: Path | None) -> tuple[dict, int, bool]:
    """``reference_run``, kept in ``cache`` (a folder; None: not kept) under its
    ``reference_key`` and read back by a later validation of the same datasets. Returns the
    contrasts, the divergences and whether they were read back."""
    path = None
    if cache is not None:
        key = reference_key(b, fitter, priors, h5_priors, draws, seed, target_accept, form)
        path = Path(cache) / f"reference-{b.block}-{key}.npz"
    contrasts, divergent, cached = kept_or_fitted(
        path, lambda: reference_run(b, fitter, priors, h5_priors, draws, seed, target_accept, form))
    return contrasts, int(divergent), cached


def converged_reference(b, fitter, priors, h5_priors, draws: int, seed: int, rule, cache: Path | None = None,
                        log=lambda message: None) -> tuple[dict, int, list[dict]]:
    """The reference of one block of one dataset: ``REFERENCE_ATTEMPTS`` in order until a run
    meets the convergence rule ``rule``. The last run is kept either way; ``attempts`` records
    each run's target acceptance, frame form and convergence beside the comparison; ``log`` gets
    a line after every attempt (a registered-size reference runs for many minutes); ``cache``:
    where each attempt is kept and read back (``cached_reference_run``), so a stopped
    validation resumes where it stopped."""
    from fear_assets.models.primary_model import FRAME_PARAMETRISATIONS
    from fear_assets.simulation.accelerated import frame_form

    attempts = []
    for target, other in REFERENCE_ATTEMPTS:
        form = None
        if other is not None:
            registered_form = frame_form(b, fitter.rule)
            if registered_form is None:
                continue  # a block whose form is fixed (joint, H5) has no other form
            form = next(f for f in FRAME_PARAMETRISATIONS if f != registered_form)
        t = time.perf_counter()
        contrasts, divergent, cached = cached_reference_run(b, fitter, priors, h5_priors, draws, seed, target, form,
                                                            cache)
        conv = _per_dataset_convergence({c: [x] for c, x in contrasts.items()}, [divergent], rule)[0]
        attempts.append({"target_accept": target, "frame_form": form or "the rule's", **conv})
        log(f"reference at target acceptance {target or 'default'}, {form or 'the rule'}'s form: "
            f"{_brief_conv(conv)}, " + ("read from the cache" if cached else f"{time.perf_counter() - t:.0f} s"))
        if not conv["failing"]:
            break
    return contrasts, divergent, attempts


def validate(args) -> int:
    """(a) the accelerator path's contrasts against a long nutpie run of the same datasets (MCSE
    units, labels), with ESS/R-hat on every contrast; (b) SBC on a reduced design; (c) speed
    against the nutpie loop at the registered sampler. JSON to benchmarks/results/."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fear_assets.core.settings import load_settings
    from fear_assets.models.h5_model import H5Priors
    from fear_assets.models.primary_model import Fitter, Priors, sample
    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation import validation
    from fear_assets.simulation.blocks import simulate_blocks
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.runner import Rules

    t_start = time.perf_counter()
    settings = load_settings()
    rules, priors, h5p = Rules.from_settings(settings), Priors.from_settings(settings), H5Priors.from_settings(settings)
    rule = settings.fitting.frame_parametrisation
    s = settings.simulation_sampler
    if args.quick:
        # The registered minimum frame count (50) at one depth: the power simulation never fits
        # fewer frames for a registered family, and at 5 frames the registered nutpie sampler
        # itself misses the convergence rule (divergences; docs/power-gate.md). Four datasets, of
        # which the rule fits three centred and one non-centred, and 16 SBC draws: every part runs
        # in about 15 minutes on 2 CPU cores with the registered sampler, above the 10 asked for;
        # 8 datasets' candidate fits alone took 21 minutes there (benchmarks/RESULTS.md).
        frames, depths, K, sbc_n, long_draws = 50, 1, 4, 16, 1000
        sbc_n = sbc_n if args.sbc_draws is None else args.sbc_draws
    else:
        frames, depths, K, long_draws = args.frames, args.depths, args.datasets, args.reference_draws or 4000
        sbc_n = 500 if args.sbc_draws is None else args.sbc_draws
    algorithm = args.algorithm or s.algorithm
    adaptive = algorithm in acc.ADAPTIVE_ALGORITHMS
    # the candidate's lengths: the registered section's, or those given (recorded in the JSON)
    chains = args.chains or s.chains
    warmup = args.warmup if args.warmup is not None else s.warmup
    draws = args.draws or s.draws
    pilot_steps = 300 if args.quick else s.pilot_steps
    sampler = argparse.Namespace(**{**vars(s), "pilot_steps": pilot_steps, "algorithm": algorithm, "chains": chains,
                                    "warmup": warmup, "draws": draws,
                                    "target_accept": args.target_accept or s.target_accept})
    remedy = settings.fitting.convergence_remedy
    extensions = remedy.max_extensions if adaptive else 0
    if args.sbc_shard:  # only this shard's SBC batches, into the cache (a later validate ranks them all)
        k, m = (int(x) for x in args.sbc_shard.split("/"))
        out = _sbc(settings, priors, h5p, sampler, sbc_n, warmup, draws, settings.master_seed,
                   cache=args.reference_cache, shard=(k, m))
        print(f"sbc shard {k}/{m}: {json.dumps(out, default=float)}")
        return 0
    if args.sbc_reproduce:
        return sbc_reproduce(Path(args.sbc_reproduce), settings, priors, h5p, sampler, sbc_n, warmup, draws,
                             Path(args.out))
    keys = [f"d{i}" for i in range(1, depths + 1)]
    design = simulated_design(settings, keys, keys[-2:] if depths >= 2 else keys, frames, (0.2, 0.2), seed=1)
    est = _validation_estimates()
    blocks = tuple(args.blocks)
    seed = settings.master_seed
    res = {"what": "issue 28 item 3: accelerator path vs a long nutpie run, SBC, speed; benchmarks/power_gpu.py validate",
           "quick": bool(args.quick), "frames": frames, "depths": depths, "rows": design.rows, "datasets": K,
           "blocks": list(blocks), "scenario": args.scenario, "sampler": vars(sampler),
           "extension": {"draws": s.extension_draws, "max_extensions": extensions},
           "reference": {"sampler": "nutpie (registered model via Fitter, the registered frame rule)", "chains": 4,
                         "tune": 1000, "draws": long_draws,
                         "retries_target_accept": [t for t in REFERENCE_TARGET_ACCEPT if t is not None],
                         "attempts": [{"target_accept": t, "frame_form": f or "the rule's"} for t, f in REFERENCE_ATTEMPTS]},
           "settings_sha256": settings.sha256, "load_before": os.getloadavg(), "cpu_count": os.cpu_count()}
    # datasets 0..K-1 are scored; K..K+pilot-1 tune the frozen samplers (never scored)
    sims = [simulate_blocks(design, est, rules, "validate", args.scenario, i, seed, blocks, priors.fixed_sd)
            for i in range(K + (0 if adaptive else s.pilot_datasets))]
    short_all, long_all, ropes, conv, speed, ref_conv, cand_conv = {}, {}, {}, {}, {}, {}, {}
    for block in blocks:
        # one program per frame form the registered rule picks, as power_simulation's accelerator path fits a batch
        bf = acc.fit_block([x[block] for x in sims[:K]], [x[block] for x in sims[K:]], priors, h5p, rule, sampler,
                           seed, settings.convergence, extensions,
                           log=lambda m: print(f"[{time.perf_counter() - t_start:.0f} s] {m}", flush=True))
        short, div, fits, tune_s, run_s = bf.contrasts, bf.divergences, bf.programs, bf.tune_s, bf.run_s
        for f in fits:
            print(f"[{time.perf_counter() - t_start:.0f} s] {block} form {f['form']}: "
                  f"{json.dumps(f, default=float)[:700]}", flush=True)
        conv[block] = validation.convergence_counts(short, settings.convergence, div)
        cand_per_ds = _per_dataset_convergence(short, div, settings.convergence)
        # the long reference run and the registered nutpie loop, same datasets
        ref = Fitter(priors, long_draws, 1000, 4, rule=rule)
        loop = Fitter(priors, settings.sampler.draws, settings.sampler.tune, settings.sampler.chains, rule=rule)
        long, loop_s, ref_div = {}, [], []
        ref_attempts = []
        for k in range(K):
            b = sims[k][block]
            contrasts, divergent, tried = converged_reference(
                b, ref, priors, h5p, long_draws, seed + 7 + k, settings.convergence, cache=args.reference_cache,
                log=lambda m, k=k: print(f"[{time.perf_counter() - t_start:.0f} s] {block} dataset {k}: {m}", flush=True))
            ref_attempts.append(tried)
            for c, x in contrasts.items():
                long.setdefault(c, []).append(x)
            ref_div.append(divergent)
            if k < args.loop_datasets:
                if b.kind != "h5":
                    from fear_assets.models.primary_model import BUILDERS
                    # compile apart: the loop compiles once per shape and form
                    loop.compiled_for(b.data, None if b.kind != "primary" else BUILDERS[(loop.form_for(b.data), "cells")])
                t = time.perf_counter()
                if b.kind == "h5":
                    sample(b.build(priors, h5p), settings.sampler.draws, settings.sampler.tune, settings.sampler.chains, k)
                else:
                    loop.fit(b.data, seed + 100 + k)
                loop_s.append(time.perf_counter() - t)
            print(f"[{time.perf_counter() - t_start:.0f} s] {block}: reference {k + 1} of {K}", flush=True)
        for c in short:
            ropes[c] = float(rules.sesoi) if b.rope is None else float(b.rope)
        short_all.update(short)
        long_all.update(long)
        ref_per_ds = _per_dataset_convergence(long, ref_div, settings.convergence)
        ref_conv[block] = {"per_dataset": ref_per_ds, "attempts": ref_attempts,
                           "datasets_failing": [k for k, r in enumerate(ref_per_ds) if r["failing"]]}
        cand_conv[block] = cand_per_ds
        for k in range(K):
            print(f"[{time.perf_counter() - t_start:.0f} s] {block} dataset {k}: candidate {_brief_conv(cand_per_ds[k])}"
                  f" | reference {_brief_conv(ref_per_ds[k])}", flush=True)
        per_ds = run_s / K
        speed[block] = {"tune_s": tune_s, "fits": fits, "accelerated_s_per_dataset": per_ds,
                        "accelerated_s_per_dataset_amortised": (tune_s + sum(
                            sum(v for v in f["timings"].values()) for f in fits)) / K,
                        "nutpie_loop_s_per_dataset": float(np.median(loop_s)), "nutpie_loop_datasets": len(loop_s),
                        "speedup_vs_nutpie": float(np.median(loop_s)) / per_ds,
                        "divergences": int(sum(np.asarray(d).sum() for d in div))}
        print(f"[{time.perf_counter() - t_start:.0f} s] {block}: {json.dumps(speed[block], default=float)[:600]}",
              flush=True)
    comp = validation.compare_runs(short_all, long_all, settings.decision.hdi_prob, ropes, seed)
    res["comparison"] = {k: v for k, v in comp.items() if k != "rows"}
    res["comparison_rows"] = comp["rows"]
    res["convergence"] = conv
    res["convergence_per_dataset"] = cand_conv
    res["reference_convergence"] = ref_conv
    # which comparisons rest on a failing reference (its divergences, ESS or R-hat miss the rule):
    # the largest |z| apart for the datasets whose reference converged and for those whose did not
    bad_ref = {(blk, k) for blk, r in ref_conv.items() for k in r["datasets_failing"]}
    block_of = {c: blk for blk in blocks for c in conv[blk]["per_contrast"]}
    zmax = {True: 0.0, False: 0.0}
    for row in comp["rows"]:
        z = max(abs(row[f"z_{st}"]) for st in ("mean", "sd", "hdi_low", "hdi_high") if f"z_{st}" in row)
        ok = (block_of.get(row["contrast"]), row["dataset"]) not in bad_ref
        zmax[ok] = max(zmax[ok], z)
    res["comparison"]["datasets_with_failing_reference"] = sorted(f"{blk}:{k}" for blk, k in bad_ref)
    res["comparison"]["max_endpoint_z_reference_converged"] = zmax[True]
    res["comparison"]["max_endpoint_z_reference_failing"] = zmax[False] if bad_ref else None
    if bad_ref:
        print(f"reference FAILS the convergence rule on {sorted(f'{blk}:{k}' for blk, k in bad_ref)}: the comparisons "
              f"of those datasets rest on a failing reference (their max |z| {zmax[False]:.2f}; datasets with a "
              f"converged reference: " + (f"{zmax[True]:.2f})" if any(
                  (block_of.get(r["contrast"]), r["dataset"]) not in bad_ref for r in comp["rows"]) else "none)"),
              flush=True)
    res["speed"] = speed
    print(f"[{time.perf_counter() - t_start:.0f} s] comparison: {json.dumps(res['comparison'])}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")  # kept if the SBC is stopped

    def sbc_so_far(partial):  # the ranks of a long SBC, written after every batch
        out.write_text(json.dumps({**res, "sbc": partial}, indent=1, default=float) + "\n")

    res["sbc"] = _sbc(settings, priors, h5p, sampler, sbc_n, warmup, draws, seed, partial=sbc_so_far,
                      cache=args.reference_cache) if sbc_n else None
    if res["sbc"]:
        print(f"[{time.perf_counter() - t_start:.0f} s] sbc: {json.dumps(res['sbc']['per_quantity'])}", flush=True)
    res["load_after"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t_start
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")
    speedup = min(v["speedup_vs_nutpie"] for v in speed.values())
    sbc_p = res["sbc"]["min_p"] if res["sbc"] else float("nan")
    # passed: the MCSE comparison and the labels, the SBC (where run), and every dataset meeting the
    # convergence rule on every contrast (a sampler with tiny ESS has wide MCSEs and passes the z-test alone)
    converged = all(c["datasets_failing_any"] == 0 for c in conv.values())
    n_ref_bad = len(res["comparison"]["datasets_with_failing_reference"])
    res["verdict"] = validation.verdict(comp["passed"], sum(c["datasets_failing_any"] for c in conv.values()),
                                        n_ref_bad, res["sbc"]["passed"] if res["sbc"] else None)
    res["passed"] = res["verdict"]["passed"]
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"validation {res['verdict']['status']} (comparison {comp['passed']}, every dataset converged {converged}, "
          f"sbc {res['sbc']['passed'] if res['sbc'] else 'not run'}; the reference fails the convergence rule on "
          f"{n_ref_bad} of {K * len(blocks)} datasets){': ' + '; '.join(res['verdict']['reasons']) if res['verdict']['reasons'] else ''} "
          f"passed={res['passed']} json={out} total_s={res['total_s']:.0f}")
    print(f"label_flips={comp['label_flips']} max_endpoint_z={comp['max_endpoint_z']:.2f} sbc_min_p={sbc_p:.3g} "
          f"speedup_vs_nutpie={speedup:.2f}")
    return 0


def sbc_reproduce(stored_path: Path, settings, priors, h5p, sampler, n: int, warmup: int, draws: int,
                  out: Path) -> int:
    """The first ``n`` prior draws of a stored SBC (a validate JSON) fitted again by this code,
    their ranks compared with the stored ones: after a change to the SBC's sources that should
    not change its fits (its cache key covers the source, so a whole rerun refits every batch),
    identical ranks show the stored SBC is this code's. The prior draws and batch seeds do not
    depend on how many draws follow, so the first ``n`` are the stored run's first ``n``.
    Exits 1 where any rank differs; refuses a stored run of other settings or sampler."""
    stored = json.loads(stored_path.read_text())
    ours, theirs = json.loads(json.dumps(vars(sampler), default=float)), stored.get("sampler", {})
    differ = {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}
    if stored.get("settings_sha256") != settings.sha256 or differ or not stored.get("sbc"):
        raise SystemExit(f"--sbc-reproduce {stored_path}: not this SBC (settings "
                         f"{str(stored.get('settings_sha256'))[:12]} vs {settings.sha256[:12]}; sampler fields "
                         f"(stored, ours) {differ}; SBC present {bool(stored.get('sbc'))}): give the same "
                         f"--algorithm, --warmup, --draws and --target-accept as the stored run")
    batch = int(stored["sbc"].get("batch", 8))
    if n > stored["sbc"]["prior_draws"] or n % batch:
        raise SystemExit(f"--sbc-draws {n}: give a multiple of the stored SBC's batch ({batch}: datasets fitted "
                         f"together share a program, the pooled candidate's trajectory length too) up to its "
                         f"{stored['sbc']['prior_draws']} prior draws")
    t = time.perf_counter()
    again = _sbc(settings, priors, h5p, sampler, n, warmup, draws, settings.master_seed, batch=batch)
    same = {k: again["ranks"][k] == stored["sbc"]["ranks"][k][:n] for k in again["ranks"]}
    res = {"what": "the first prior draws of a stored SBC fitted again by this code; benchmarks/power_gpu.py validate "
                   "--sbc-reproduce", "stored": str(stored_path), "prior_draws": n, "sampler": ours,
           "settings_sha256": settings.sha256, "identical_ranks": same, "reproduced": all(same.values()),
           "ranks": again["ranks"], "divergences": again["divergences"], "seconds": time.perf_counter() - t}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"sbc_reproduced={res['reproduced']} prior_draws={n} of {stored['sbc']['prior_draws']} json={out}")
    return 0 if res["reproduced"] else 1


def _per_dataset_convergence(draws: dict, divergences, rule) -> list[dict]:
    """Per dataset, over every reported contrast (``draws``: contrast -> K arrays (chains, draws)):
    divergences, the smallest bulk and tail ESS, the largest R-hat, and whether the registered
    convergence rule fails."""
    from fear_assets.simulation import diagnostics as dg, validation

    out = []
    for k in range(len(next(iter(draws.values())))):
        xs = [np.asarray(v[k]) for v in draws.values()]
        d = int(np.sum(divergences[k]))
        # numpy's min and max carry a NaN through, where Python's depend on the order
        eb, et, rh = (np.min([dg.ess_bulk(x) for x in xs]), np.min([dg.ess_tail(x) for x in xs]),
                      np.max([dg.rhat(x) for x in xs]))
        out.append({"divergences": d, "ess_bulk_min": float(eb), "ess_tail_min": float(et), "rhat_max": float(rh),
                    "failing": not validation.meets_rule(rule, rh, eb, et, d)})
    return out


def _brief_conv(c: dict) -> str:
    return (f"div {c['divergences']} ess bulk {c['ess_bulk_min']:.0f} tail {c['ess_tail_min']:.0f} "
            f"rhat {c['rhat_max']:.3f}{' FAILS' if c['failing'] else ''}")


def _sbc(settings, priors, h5p, sampler, n, warmup, draws, seed, batch: int = 8, partial=None,
         cache: Path | None = None, shard: tuple[int, int] | None = None) -> dict:
    """SBC of the primary model on a reduced design (5 frames, one depth): ``n`` prior draws
    (PyMC's prior predictive of the registered model), each fitted by the accelerator path in
    batches of ``batch`` datasets (a batch's transition lasts as long as its longest
    trajectory, and prior draws differ far more than one design's datasets do); ranks of
    H1-H3, sigma, nu and the six frame SDs; a chi-square uniformity test each, passed where the
    smallest p is above 0.01 / the number of quantities. ``partial``: called after every batch
    with the result on the draws fitted so far (``complete`` False), so a long SBC stopped
    early still leaves its ranks. ``cache``: a folder where every fitted batch is kept (its key:
    the batch's simulated outcomes, the sampler's settings, lengths and seed, and the sampler's
    source, ``SBC_SOURCES``) and read back, so an SBC of many hours can run in several sittings.
    ``shard`` (k, m): fit only batches i with i % m == k into the cache and return their count
    (no ranks), so m processes (cores, machines sharing the folder) fit one SBC; a run without
    a shard then reads every batch back and ranks them."""
    import pymc as pm

    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation import validation
    from fear_assets.simulation.blocks import simulate_blocks
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.runner import Rules

    t = time.perf_counter()
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=2)
    b = simulate_blocks(design, _validation_estimates(), Rules.from_settings(settings), "sbc", "null", 0, seed,
                        ("primary",), None)["primary"]
    extra = ("sigma", "nu", "frame_chol_stds")
    prog = acc.block_program(b, priors, h5p, extra=extra)
    prior = pm.sample_prior_predictive(draws=n, model=prog.model, random_seed=seed)
    Y = prior.prior_predictive["y_obs"].values.reshape(n, -1)
    names = acc.CONTRAST_VARIABLES["primary"] + extra
    truth_kept = np.concatenate([prior.prior[v].values.reshape(n, -1) for v in names], axis=1)
    truth = {c: v.reshape(n) for c, v in acc.contrast_draws(prog, truth_kept[:, None, None, :]).items()}
    truth.update({"sigma": prior.prior["sigma"].values.reshape(n), "nu": prior.prior["nu"].values.reshape(n)})
    sds = prior.prior["frame_chol_stds"].values.reshape(n, -1)
    truth.update({f"frame_sd[{j}]": sds[:, j] for j in range(sds.shape[1])})
    tuned = acc.tune(prog, Y, sampler, seed + 3)

    def quantities(kept):  # each ranked quantity's posterior draws, (datasets, chains, draws)
        post = acc.contrast_draws(prog, kept)
        by_name = acc.kept_by_name(prog, kept)
        post.update({"sigma": by_name["sigma"], "nu": by_name["nu"]})
        post.update({f"frame_sd[{j}]": by_name["frame_chol_stds"][..., j] for j in range(sds.shape[1])})
        return post

    parts, div, timings = [], [], {"compile_s": 0.0, "run_s": 0.0}

    def result(m):
        out = validation.sbc({k: v[:m] for k, v in truth.items()},
                             {k: np.concatenate([p[k] for p in parts]) for k in truth})
        d = np.concatenate(div)
        out.update({"passed": bool(out["min_p"] > 0.01 / len(truth)), "complete": m == n, "prior_draws_planned": n,
                    "seconds": time.perf_counter() - t, "divergences": int(d.sum()),
                    "prior_draws_with_divergences": int((d > 0).sum()), "rows": design.rows, "batch": batch,
                    "fit": dict(timings), "batches_read_from_cache": read_back})
        return out

    code = source_digest(*SBC_SOURCES)
    read_back = 0
    if shard is not None and cache is None:
        raise ValueError("an SBC shard keeps its batches in the cache: give --reference-cache")
    for i, lo in enumerate(range(0, n, batch)):
        if shard is not None and i % shard[1] != shard[0]:
            continue
        path = None
        if cache is not None:
            key = hashlib.sha256(json.dumps([vars(sampler), warmup, draws, seed + 4 + i, code], sort_keys=True,
                                            default=str).encode() + Y[lo:lo + batch].tobytes()).hexdigest()[:24]
            path = Path(cache) / f"sbc-batch-{key}.npz"

        def fit(i=i, lo=lo):
            f = acc.fit_batch(tuned, Y[lo:lo + batch], seed + 4 + i, warmup, draws)
            for k in timings:
                timings[k] += f["timings"].get(k, 0.0)
            return quantities(f["kept"]), np.asarray(f["divergences"]).reshape(len(f["kept"]), -1).sum(axis=1)

        q, d, cached = kept_or_fitted(path, fit)
        parts.append(q)
        div.append(d)
        read_back += cached
        m = min(lo + batch, n)
        print(f"[sbc] {m} of {n} prior draws fitted ({timings['run_s']:.0f} s run, {read_back} batches read "
              f"from the cache)", flush=True)
        if partial is not None and m < n and shard is None:
            partial(result(m))
    if shard is not None:
        return {"shard": list(shard), "batches": len(parts), "batches_read_from_cache": read_back,
                "seconds": time.perf_counter() - t, "fit": dict(timings)}
    return result(n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="here, with PyMC: write the artefact folder")
    e.add_argument("--frames", type=int, default=50)
    e.add_argument("--depths", type=int, default=8)
    e.add_argument("--datasets", type=int, default=256)
    e.add_argument("--check-points", type=int, default=3)
    e.add_argument("--out", default=str(ART))
    r = sub.add_parser("run", help="device side: numpy, scipy, jax, blackjax only")
    r.add_argument("--artefacts", default=str(ART))
    r.add_argument("--platform", help="JAX_PLATFORMS (cuda, cpu); default: jax's choice")
    r.add_argument("--datasets", type=int, nargs="*", default=[16, 64, 256],
                   help="K per fit, in order; each later K is projected from the previous fit and skipped if it "
                        "would pass --max-seconds")
    r.add_argument("--grad-batches", type=int, nargs="*", default=[1, 64, 256, 1024])
    r.add_argument("--reps", type=int, default=50)
    r.add_argument("--adapt", type=int, default=250)
    r.add_argument("--warmup", type=int, default=100)
    r.add_argument("--draws", type=int, help="default: the registered sampler draws (manifest)")
    r.add_argument("--target-accept", type=float, default=0.8)
    r.add_argument("--dense", action="store_true", help="dense mass matrix (default diagonal)")
    r.add_argument("--algorithm", choices=["nuts", "chees_hmc", *ADAPTIVE_CANDIDATES],
                   default="nuts",
                   help="nuts: reference window adaptation, then NUTS per dataset; chees_hmc: jittered fixed-length "
                        "HMC tuned once by ChEES on --pilot-datasets datasets (--adapt steps), then frozen; "
                        "adaptive_hmc: jittered HMC with every dataset's own warm-up (--warmup steps; "
                        "--target-accept 0.9 as validated); adaptive_hmc_dense: the same with a mass matrix dense "
                        "on the global parameters, diagonal on the unit intercepts; adaptive_hmc_dense_oas: that dense "
                        "block shrunk towards its diagonal (OAS); adaptive_hmc_dense_pooled: the block metric with one "
                        "trajectory length for the batch (ChEES averaged over every dataset)")
    r.add_argument("--pilot-datasets", type=int, default=8)
    r.add_argument("--json", default="power_gpu.json", help="result file name under $OUT (or benchmarks/results)")
    r.add_argument("--chains", type=int, help="chains per dataset (default: the registered sampler's, manifest)")
    r.add_argument("--max-seconds", type=float, default=270.0)
    r.add_argument("--reference-draws", type=int, default=0,
                   help="after the fits, a long run (this many draws) of the first fit's datasets: the largest "
                        "|99%% HDI endpoint| difference of H1-H3 against it (0: none)")
    v = sub.add_parser("validate", help="here, with PyMC: the accelerator path against a long nutpie run, SBC")
    v.add_argument("--quick", action="store_true", help="50 frames x 1 depth, 4 datasets (both frame forms), "
                   "SBC 16 draws: a smoke test of every part (the registered evidence: 64 datasets a scenario)")
    v.add_argument("--frames", type=int, default=50)
    v.add_argument("--depths", type=int, default=8)
    v.add_argument("--datasets", type=int, default=64)
    v.add_argument("--sbc-draws", type=int, help="SBC prior draws (default 16 with --quick, else 500; 0: no SBC)")
    v.add_argument("--blocks", nargs="*", default=["primary"])
    v.add_argument("--scenario", default="meaningful")
    v.add_argument("--algorithm", choices=["chees_hmc", "nuts", *ADAPTIVE_CANDIDATES],
                   help="default: the registered simulation_sampler's; adaptive_hmc: the candidate with every "
                        "dataset's own warm-up (not registered); adaptive_hmc_dense: the same with a mass matrix "
                        "dense on the global parameters, diagonal on the unit intercepts; adaptive_hmc_dense_oas: "
                        "that dense block shrunk towards its diagonal (OAS); adaptive_hmc_dense_pooled: the block "
                        "metric with one trajectory length for the batch")
    v.add_argument("--reference-draws", type=int, help="the long nutpie run's draws per chain (4 chains, 1,000 "
                                                        "tuning; default 4,000, 1,000 with --quick)")
    v.add_argument("--chains", type=int, help="chains per dataset (default: the registered section's)")
    v.add_argument("--warmup", type=int, help="warm-up steps per dataset (default: the registered section's)")
    v.add_argument("--draws", type=int, help="draws per chain (default: the registered section's)")
    v.add_argument("--sbc-shard", help="K/M: fit only SBC batches i with i %% M == K into --reference-cache and "
                   "stop (M processes share one SBC; a run without it ranks every batch)")
    v.add_argument("--sbc-reproduce", help="a stored validate JSON: fit only its first --sbc-draws prior draws "
                   "again and compare their ranks with its own (exit 1 where any differs); writes --out and stops")
    v.add_argument("--target-accept", type=float, help="an adaptive candidate's target acceptance (default: the "
                   "registered section's); recorded in the JSON's sampler")
    v.add_argument("--loop-datasets", type=int, default=3, help="datasets timed through the registered nutpie loop")
    v.add_argument("--reference-cache", type=Path, default=REFERENCE_CACHE,
                   help="folder keeping each finished reference run and SBC batch, read back by a later validation "
                        "of the same datasets (keyed by their data, settings, seeds and the code that fits them)")
    v.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "power_validation.json"))
    args = ap.parse_args()
    return {"export": export, "run": run, "validate": validate}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
