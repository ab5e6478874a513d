"""The registered primary model: nutpie vs PyMC's default NUTS, side by side (CPU).

Run (from the repository root; the machine is shared, so at low priority):

    nice -n 19 .venv/bin/python benchmarks/fit.py            # registered size, 14,400 rows (<= 25 min)
    nice -n 19 .venv/bin/python benchmarks/fit.py --quick    # 10 frames x 2 depths, 720 rows (~2-3 min)

Model. ``fear_assets.models.primary_model``: ``prepare`` -> ``build_model`` with the
registered priors (``Priors.from_settings``), unchanged (sum-to-zero coding, six correlated
frame effects non-centred through the LKJ(2) Cholesky factor, non-centred unit intercept,
Student-t likelihood).

Data. A synthetic data set of registered size with the model's structure, simulated here:
50 frames (10 per fear class) x 3 rotations x 2 orders x 8 depths x 6 agent x content cells
= 14,400 rows; a unit (frame x rotation x order x depth, 2,400 units) intercept with sd 0.1;
six frame effects (intercept, agent x2, content, agent x content x2 in the model's own
sum-to-zero columns) with sds 0.15, 0.05, 0.05, 0.08, 0.03, 0.03 and intercept-content
correlation 0.3; a depth trend, small fear-class effects, one surprisal covariate with a
slope of 0.1; Student-t(8) residuals with scale 0.2. Threat-minus-harmless effects
self 0.5, peer 0.2, person 0.1, the same at every depth, so the true H2 (self - peer) is 0.3.

Arms, one after the other on the same data with the same seed and number of chains, each in
its own process (killed, with its process group, at its wall-clock cap) and, unless
``--warm-cache``, with an empty PyTensor compile cache of its own (cold compile):
  nutpie  ``nutpie.compile_pymc_model(model)`` then ``nutpie.sample(compiled, draws, tune,
          chains, seed, low_rank_modified_mass_matrix=True)``: the calls of
          ``primary_model.sample`` (numba backend; nutpie's default cores, one thread a chain;
          one BLAS thread, see below).
  pymc    ``pm.sample(draws, tune, chains, random_seed=seed)`` with everything else at
          PyMC's defaults (NUTS, jitter+adapt_diag, convergence checks, and cores =
          min(4, logical CPUs // 2): on a 2-CPU machine, 1 core, the chains one after
          another; ``--pymc-cores`` overrides); a callback logs each draw (time, chain, H2
          value, leapfrog steps) to a progress file.

Figures per arm: compile seconds (nutpie: ``compile_pymc_model``; PyMC: everything in
``pm.sample`` before its sampling loop, i.e. compiling logp/dlogp, initial points, worker
start-up), sampling seconds (nutpie: ``nutpie.sample``; PyMC: its own ``sampling_time``,
the tuning + draws loop), post-processing seconds (PyMC: after the loop: trace to
InferenceData and its convergence checks), the arm's wall and CPU seconds (its whole
process tree: imports, data preparation, model building, compile, sampling), gradient
evaluations (leapfrog steps, tuning included) and sampling milliseconds per gradient, bulk
and tail ESS and R-hat of the H2 contrast (``cell_means`` over ``--band`` and
``hypotheses``, on the draws shaped (chain, draw)), ESS/s over sampling seconds and over
compile + sampling seconds, the project's ``convergence`` summary (max R-hat, min bulk/tail
ESS over intercept, beta, sigma, nu; divergences), and the H2 posterior mean and 99% HDI
against the truth. Ratios are nutpie over PyMC for ESS/s and ESS per CPU second (above 1:
nutpie better) and PyMC over nutpie for seconds (the speed-up; above 1: nutpie faster).

Caps. The whole run is held to ``--budget`` seconds (default 1,500, 25 minutes): nutpie
runs first under ``--nutpie-cap``; PyMC gets what is left of the budget minus a margin. If
PyMC hits its cap, its compile + sampling time is recorded as a lower bound (the time it
had spent inside ``pm.sample``) and the ratios as bounds, labelled so; its progress file
gives how far it got, a rough extrapolation of its sampling time (iterations left at its
recent rate) and, if it was past tuning, the ESS of its partial draws. The strict bound on
the ESS/s ratio uses ArviZ's ceiling on ESS (N log10 N for N draws in all); a looser,
labelled one assumes PyMC's ESS is at most N (independent draws).

The last line printed is ``ess_per_s_ratio_tail=<nutpie/PyMC> ess_per_s_ratio_bulk=<...>
speedup_compile_plus_sampling=<PyMC/nutpie>``, all on compile + sampling seconds (with
``>=`` where a cap made it a bound). Figures go to ``benchmarks/results/fit.json`` (one
entry per variant: ``full`` or ``quick``, plus ``+nutpie-blas-unlimited`` etc. for the
options that change the set-up); ``--markdown`` prints a RESULTS.md section from that file.

BLAS threads. Both backends call OpenBLAS (numpy's / scipy's), which by default starts one
thread per CPU in every call. nutpie runs its chains as threads, so with 2 chains on 2 CPUs
each chain's BLAS calls also try to use both CPUs and the threads oversubscribe the cores
(measured: about 7x slower per gradient at registered size on 2 cores). The nutpie arm
therefore samples with one BLAS thread (``threadpoolctl``, ``user_api="blas"``), as
``primary_model.sample`` does; ``--nutpie-blas-threads N`` sets another limit and 0 none
(OpenBLAS's default). PyMC's default runs its chains one after another here, so its BLAS
threads are left at the default.
No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import json
import os
import resource
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

RESULTS_JSON = ROOT / "benchmarks" / "results" / "fit.json"
ARMS = ("nutpie", "pymc")
AGENTS = ("self", "peer", "person")
CONTENTS = ("threat", "harmless")
#: threat-minus-harmless effect per agent; H2 = self - peer
EFFECTS = {"self": 0.5, "peer": 0.2, "person": 0.1}
TRUE_H2 = EFFECTS["self"] - EFFECTS["peer"]
FRAME_SD = np.array([0.15, 0.05, 0.05, 0.08, 0.03, 0.03])
UNIT_SD = 0.1
RESIDUAL_SCALE, RESIDUAL_DF = 0.2, 8
MARGIN_S = 45.0  # kept back from the budget for the parent's own work after the PyMC arm


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------
def levels_for(fears, depths) -> dict:
    return {"agent": list(AGENTS), "content": list(CONTENTS), "depth": list(depths), "order": [1, 2],
            "option": [1, 2], "rotation": [1, 2, 3], "fear": list(fears)}


def simulate(levels: dict, frames_per_fear: int, seed: int) -> pd.DataFrame:
    """Registered-size design with unit and frame effects and a known H2 (module docstring)."""
    from fear_assets.models.coding import frame_slopes

    rng = np.random.default_rng(seed)
    fears, depths = levels["fear"], levels["depth"]
    n_frames = frames_per_fear * len(fears)
    corr = np.eye(6)
    corr[0, 3] = corr[3, 0] = 0.3
    cov = np.outer(FRAME_SD, FRAME_SD) * corr
    frame_eff = rng.multivariate_normal(np.zeros(6), cov, size=n_frames)
    fear_eff = dict(zip(fears, np.linspace(-0.05, 0.05, len(fears))))
    depth_eff = {d: -0.02 * i for i, d in enumerate(depths)}
    agent_main = {"self": 0.05, "peer": 0.0, "person": -0.05}
    rows = []
    for f, rot, order, (k, depth) in itertools.product(range(n_frames), (1, 2, 3), (1, 2), enumerate(depths)):
        unit = f"F{f:02d}|r{rot}|o{order}|{depth}"
        u = rng.normal(0, UNIT_SD)
        for cell, (agent, content) in enumerate(itertools.product(AGENTS, CONTENTS), start=1):
            option = 1 if (rot + 3 * (order - 1) + k + cell) % 2 == 0 else 2
            sign = 0.5 if content == "threat" else -0.5
            s_name, s_rest = rng.normal(0, 0.2), rng.normal(0, 0.2)
            mean = (-0.3 + fear_eff[fears[f % len(fears)]] + depth_eff[depth] + agent_main[agent]
                    + EFFECTS[agent] * sign + u + 0.1 * s_name)
            rows.append({"agent": agent, "content": content, "depth": depth, "order": order, "option": option,
                         "rotation": rot, "fear": fears[f % len(fears)], "frame": f"F{f:02d}", "unit": unit,
                         "surprisal_name": s_name, "surprisal_rest": s_rest, "mean": mean})
    data = pd.DataFrame(rows)
    z = frame_slopes(data, levels)
    frame_idx = data["frame"].str[1:].astype(int).to_numpy()
    noise = RESIDUAL_SCALE * rng.standard_t(RESIDUAL_DF, size=len(data))
    data["delta"] = data.pop("mean") + (z * frame_eff[frame_idx]).sum(axis=1) + noise
    return data


def h2_weights(d, band) -> np.ndarray:
    """H2 is linear in beta: H2 = beta @ w (cell_means and hypotheses on the unit vectors)."""
    from fear_assets.models.primary_model import cell_means, hypotheses

    p = d.X.shape[1]
    return np.asarray(hypotheses(cell_means(d, np.eye(p), np.zeros(p), band))["H2"], dtype=float)


# ---------------------------------------------------------------------------------------
# One arm (child process)
# ---------------------------------------------------------------------------------------
def h2_chain_draw(d, idata, band) -> np.ndarray:
    from fear_assets.models.primary_model import cell_means, hypotheses, posterior_draws

    chains, draws = idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)
    return np.asarray(hypotheses(mu)["H2"]).reshape(chains, draws)


def h2_stats(h2: np.ndarray, hdi_prob: float) -> dict:
    import arviz as az

    low, high = az.hdi(h2.reshape(-1), hdi_prob=hdi_prob)
    return {"ess_bulk": float(az.ess(h2, method="bulk")), "ess_tail": float(az.ess(h2, method="tail")),
            "rhat": float(az.rhat(h2)), "mean": float(h2.mean()), "hdi_prob": hdi_prob,
            "hdi_low": float(low), "hdi_high": float(high), "chains": int(h2.shape[0]), "draws": int(h2.shape[1])}


def run_arm(args) -> int:
    t_process = time.perf_counter()
    work = Path(args.workdir)
    spec = json.loads((work / "spec.json").read_text())
    from fear_assets.models.primary_model import Priors, build_model, convergence, prepare
    from fear_assets.core.settings import load_settings

    settings = load_settings()
    t_imports = time.perf_counter() - t_process
    data = pd.read_pickle(work / "data.pkl")
    t = time.perf_counter()
    d = prepare(data, spec["levels"])
    model = build_model(d, Priors.from_settings(settings))
    build_s = time.perf_counter() - t
    w = h2_weights(d, spec["band"])
    draws, tune, chains, seed = spec["draws"], spec["tune"], spec["chains"], spec["seed"]
    progress = open(work / f"{args.arm}_progress.tsv", "w", buffering=1)
    out = {"arm": args.arm, "imports_s": t_imports, "build_model_s": build_s, "n_fixed": int(d.X.shape[1]),
           "n_units": int(d.n_units), "n_frames": int(d.n_frames), "loadavg_start": os.getloadavg()}
    import threadpoolctl

    out["blas_threads_default"] = [f"{i['internal_api']} {i['num_threads']}" for i in threadpoolctl.threadpool_info()]
    if args.arm == "nutpie":
        import nutpie

        limit = spec.get("nutpie_blas_threads")
        with (threadpoolctl.threadpool_limits(limits=limit, user_api="blas") if limit
              else contextlib.nullcontext()):
            progress.write(f"{time.time():.3f}\tcompile\n")
            t = time.perf_counter()
            compiled = nutpie.compile_pymc_model(model)
            out["compile_s"] = time.perf_counter() - t
            progress.write(f"{time.time():.3f}\tsample\n")
            t = time.perf_counter()
            idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, seed=seed, progress_bar=False,
                                  low_rank_modified_mass_matrix=True)
            out["sampling_s"] = time.perf_counter() - t
        out["postprocess_s"] = 0.0  # nutpie.sample's own conversion to InferenceData is in sampling_s
        out["sample_call_s"] = out["compile_s"] + out["sampling_s"]
        out["n_dim"] = int(compiled.n_dim)
        out["gradient_evaluations"] = int(sum(float(g["n_steps"].sum()) for g in (
            getattr(idata, "warmup_sample_stats", None), idata.sample_stats) if g is not None and "n_steps" in g))
        out["settings"] = {"backend": "numba (compile_pymc_model default)", "low_rank_modified_mass_matrix": True,
                           "cores": min(chains, os.cpu_count() or 1), "cores_source": "nutpie default min(chains, CPUs)",
                           "chains_run": "in parallel (threads)",
                           "blas_threads": limit or "default (OpenBLAS: one per CPU, in each chain's calls)"}
    else:
        import pymc as pm

        from pymc.sampling.parallel import _cpu_count

        first = {"steps": 0}

        def log_draw(trace, draw):
            now = time.time()
            first.setdefault("t", now)
            first["last"] = now
            div = any(bool(s.get("diverging", False)) for s in draw.stats)
            steps = int(sum(int(s.get("tree_size", s.get("n_steps", 0))) for s in draw.stats))
            first["steps"] += steps
            h2 = float(np.asarray(draw.point["beta"]) @ w)
            progress.write(f"{now:.3f}\t{draw.chain}\t{draw.draw_idx}\t{int(draw.tuning)}\t{int(div)}\t{h2:.6g}"
                           f"\t{steps}\n")

        cores = spec.get("pymc_cores")
        kwargs = {} if cores is None else {"cores": cores}
        progress.write(f"{time.time():.3f}\tsample_call\n")
        t0 = time.time()
        with model:
            idata = pm.sample(draws=draws, tune=tune, chains=chains, random_seed=seed, progressbar=False,
                              callback=log_draw, **kwargs)
        t_end = time.time()
        sampling = float(idata.posterior.attrs.get("sampling_time", idata.sample_stats.attrs.get("sampling_time")))
        loop_start = first["last"] - sampling  # the loop ends at (about) the last draw's callback
        out["compile_s"] = loop_start - t0
        out["sampling_s"] = sampling
        out["postprocess_s"] = t_end - first["last"]
        out["sample_call_s"] = t_end - t0
        out["n_dim"] = int(sum(np.size(v) for v in model.initial_point().values()))
        out["gradient_evaluations"] = first["steps"]
        used = cores if cores is not None else min(4, _cpu_count())
        out["settings"] = {"step": "NUTS (pm.sample default)", "init": "jitter+adapt_diag (default)",
                           "cores": used, "cores_source": "--pymc-cores" if cores is not None else
                           "PyMC default min(4, logical CPUs // 2)",
                           "chains_run": "in parallel" if used > 1 and chains > 1 else "one after another",
                           "compute_convergence_checks": True}
    progress.close()
    out["loadavg_end"] = os.getloadavg()
    out["h2"] = h2_stats(h2_chain_draw(d, idata, spec["band"]), spec["hdi_prob"])
    out["convergence"] = convergence(idata)
    out["arm_wall_s"] = time.perf_counter() - t_process
    (work / f"{args.arm}.json").write_text(json.dumps(out, indent=2))
    return 0


# ---------------------------------------------------------------------------------------
# Parent: the two arms under caps, then the ratios
# ---------------------------------------------------------------------------------------
def launch(arm: str, work: Path, cap: float, cold: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--workdir", str(work)]
    env = os.environ.copy()
    if cold:  # an empty PyTensor compile cache of its own (numba's and the C backend's)
        flags = [f for f in env.get("PYTENSOR_FLAGS", "").split(",") if f]
        env["PYTENSOR_FLAGS"] = ",".join([*flags, f"base_compiledir={work / ('pytensor_' + arm)}"])
    log = open(work / f"{arm}.log", "w")
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                            env=env)
    timed_out = False
    try:
        rc = proc.wait(timeout=max(cap, 1.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = proc.returncode
    wall = time.perf_counter() - t
    end_epoch = time.time()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    log.close()
    result_file = work / f"{arm}.json"
    if not timed_out and rc == 0 and result_file.is_file():
        res = json.loads(result_file.read_text())
        res.update({"completed": True, "timed_out": False, "cap_s": cap, "parent_wall_s": wall, "cpu_s": cpu})
        return res
    tail = (work / f"{arm}.log").read_text()[-3000:]
    if not timed_out:
        raise SystemExit(f"the {arm} arm failed (exit {rc}):\n{tail}")
    res = {"arm": arm, "completed": False, "timed_out": True, "cap_s": cap, "parent_wall_s": wall, "cpu_s": cpu,
           "log_tail": tail[-1500:]}
    res["partial"] = partial_progress(work / f"{arm}_progress.tsv", end_epoch)
    return res


def partial_progress(path: Path, end_epoch: float) -> dict:
    """How far a capped arm got, from its progress file (PyMC: one line per draw)."""
    if not path.is_file():
        return {}
    lines = [ln.split("\t") for ln in path.read_text().splitlines()]
    start = next((float(x[0]) for x in lines if len(x) == 2 and x[1] in ("sample_call", "compile")), None)
    out = {"in_sample_call_s": (end_epoch - start) if start is not None else None}
    rows = [x for x in lines if len(x) == 7]
    if not rows:
        out.update(iterations_per_chain={}, note="capped before the first draw (compiling or initialising)")
        return out
    spec = json.loads((path.parent / "spec.json").read_text())
    per_chain_needed = spec["tune"] + spec["draws"]
    t = np.array([float(x[0]) for x in rows])
    chain = np.array([int(x[1]) for x in rows])
    tuning = np.array([int(x[3]) for x in rows])
    div = np.array([int(x[4]) for x in rows])
    h2 = np.array([float(x[5]) for x in rows])
    steps = np.array([int(x[6]) for x in rows])
    per_chain = {int(c): int((chain == c).sum()) for c in np.unique(chain)}
    done, needed = len(rows), spec["chains"] * per_chain_needed
    # recent rate over all chains together: the last half of the draws logged
    half = t[len(t) // 2:]
    rate = (len(half) - 1) / float(half[-1] - half[0]) if len(half) > 1 and half[-1] > half[0] else float("nan")
    out.update({
        "iterations_per_chain": per_chain, "iterations_needed_per_chain": per_chain_needed,
        "iterations_done": done, "iterations_needed": needed, "setup_s": float(t.min() - start),
        "sampling_so_far_s": float(end_epoch - t.min()), "gradient_evaluations_so_far": int(steps.sum()),
        "seconds_per_gradient": float((t.max() - t.min()) / max(steps[1:].sum(), 1)),
        "iterations_per_s_recent": rate, "divergences_so_far": int(div[tuning == 0].sum()),
        "extrapolated_sampling_s": float((t.max() - t.min()) + (needed - done) / rate) if rate == rate else None,
        "note": "extrapolation: iterations left at the recent rate (all chains); rough, tree sizes change"})
    post = {int(c): h2[(chain == c) & (tuning == 0)] for c in per_chain}
    post = {c: v for c, v in post.items() if len(v) >= 20}
    if post:
        n = min(len(v) for v in post.values())
        out["partial_h2"] = h2_stats(np.stack([post[c][:n] for c in sorted(post)]), spec["hdi_prob"])
    return out


def ratio_block(nut: dict, pym: dict) -> dict:
    """nutpie/PyMC for ESS/s, PyMC/nutpie for seconds; bounds where PyMC was capped."""
    out = {}
    n_total = nut["compile_s"] + nut["sampling_s"]
    if pym["completed"]:
        p_total = pym["compile_s"] + pym["sampling_s"]
        for kind in ("bulk", "tail"):
            e_n, e_p = nut["h2"][f"ess_{kind}"], pym["h2"][f"ess_{kind}"]
            out[f"ess_per_s_{kind}_sampling"] = {"value": (e_n / nut["sampling_s"]) / (e_p / pym["sampling_s"]),
                                                 "bound": "="}
            out[f"ess_per_s_{kind}_compile_plus_sampling"] = {"value": (e_n / n_total) / (e_p / p_total),
                                                              "bound": "="}
            out[f"ess_per_cpu_s_{kind}"] = {"value": (e_n / nut["cpu_s"]) / (e_p / pym["cpu_s"]), "bound": "=",
                                            "note": "CPU seconds of each arm's whole process tree"}
        out["speedup_compile"] = {"value": pym["compile_s"] / nut["compile_s"], "bound": "="}
        out["speedup_sampling"] = {"value": pym["sampling_s"] / nut["sampling_s"], "bound": "="}
        out["speedup_compile_plus_sampling"] = {"value": p_total / n_total, "bound": "="}
        out["speedup_arm_wall"] = {"value": pym["arm_wall_s"] / nut["arm_wall_s"], "bound": "="}
        out["seconds_per_gradient_pymc_over_nutpie"] = {
            "value": (pym["sampling_s"] / pym["gradient_evaluations"]) / (nut["sampling_s"] / nut["gradient_evaluations"]),
            "bound": "=", "note": "sampling seconds per leapfrog step, tuning included; wall, not per core"}
        return out
    # PyMC capped: its compile + sampling took at least the time it spent inside pm.sample.
    p = pym.get("partial", {})
    floor = p.get("in_sample_call_s") or 0.0
    n_draws = pym["spec_draws"] * pym["spec_chains"]
    for kind in ("bulk", "tail"):
        nut_rate = nut["h2"][f"ess_{kind}"] / n_total
        out[f"ess_per_s_{kind}_compile_plus_sampling"] = {
            "value": nut_rate * floor / (n_draws * np.log10(n_draws)), "bound": ">=",
            "note": f"strict: PyMC's ESS <= N log10 N = {n_draws * np.log10(n_draws):.0f} (ArviZ's ceiling) and its "
                    f"compile + sampling >= {floor:.0f} s (time inside pm.sample when stopped)"}
        out[f"ess_per_s_{kind}_if_pymc_ess_equal_draws"] = {
            "value": nut_rate * floor / n_draws, "bound": ">=",
            "note": f"not strict: assumes PyMC's ESS <= its N = {n_draws} draws (independent draws)"}
    out["speedup_compile_plus_sampling"] = {"value": floor / n_total, "bound": ">=",
                                            "note": "PyMC stopped at its cap"}
    ext = p.get("extrapolated_sampling_s")
    if ext:
        out["speedup_compile_plus_sampling_extrapolated"] = {
            "value": (p["setup_s"] + ext) / n_total, "bound": "~",
            "note": "PyMC's sampling time extrapolated from its progress (rough)"}
    if p.get("gradient_evaluations_so_far"):
        out["seconds_per_gradient_pymc_over_nutpie"] = {
            "value": p["seconds_per_gradient"] / (nut["sampling_s"] / nut["gradient_evaluations"]), "bound": "~",
            "note": "PyMC's from its partial run (wall, not per core)"}
    return out


def machine_info() -> dict:
    import arviz
    import numba
    import nutpie
    import pymc
    import pytensor

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "pymc": pymc.__version__,
            "pytensor": pytensor.__version__, "nutpie": nutpie.__version__, "arviz": arviz.__version__,
            "numba": numba.__version__, "niceness": os.nice(0),
            "pytensor_blas_ldflags": pytensor.config.blas__ldflags or "(none: PyTensor found no BLAS to link)"}


def fmt(v, nd=1):
    return "-" if v is None else f"{v:,.{nd}f}"


def render_markdown(all_results: dict) -> str:
    out = []
    for variant, res in all_results.items():
        m, sp, arms = res["machine"], res["spec"], res["arms"]
        cores = "; ".join(f"{k}: {v['settings']['cores']} core(s), chains {v['settings']['chains_run']}"
                          for k, v in arms.items() if "settings" in v)
        if "settings" not in arms["pymc"] and sp.get("pymc_cores_effective"):
            n = sp["pymc_cores_effective"]
            cores += f"; pymc: {n} core(s), chains {'in parallel' if n > 1 else 'one after another'}"
        out += [f"### {variant.capitalize()} run", "",
                f"Command: `{res['command']}`  ",
                *([f"Same set-up with today's options: `{res['command_equivalent_now']}` ({res['note']})  "]
                  if res.get("command_equivalent_now") else []),
                f"Date: {res['date']}  ",
                f"Machine: {m['cpu']} ({m['logical_cpus']} logical CPUs, niceness {m['niceness']}), Python "
                f"{m['python']}, PyMC {m['pymc']}, PyTensor {m['pytensor']} (BLAS: {m['pytensor_blas_ldflags']}), "
                f"nutpie {m['nutpie']}, numba {m['numba']}, ArviZ {m['arviz']}  ",
                f"Data: {res['data']['rows']:,} rows, {res['data']['frames']} frames, {res['data']['units']:,} units, "
                f"{res['data']['fixed_effects']} fixed effects, {res['data']['unconstrained_dim']:,} unconstrained "
                f"parameters; true H2 {TRUE_H2}; H2 band {', '.join(sp['band'])}  ",
                f"Sampling: {sp['chains']} chains x ({sp['tune']} tune + {sp['draws']} draws), seed {sp['seed']}; "
                f"{cores}  ",
                f"Compile cache: {sp['compile_cache']}; caps: nutpie {res['caps']['nutpie']:.0f} s, PyMC "
                f"{res['caps']['pymc']:.0f} s; BLAS threads in the nutpie arm: "
                f"{arms['nutpie'].get('settings', {}).get('blas_threads', 'default')}; "
                f"run wall time {res['wall_seconds']:.0f} s", "",
                "| arm | compile s | sampling s | compile + sampling s | arm wall s | arm CPU s | gradient evals "
                "| ms / gradient | H2 bulk ESS | H2 tail ESS | bulk ESS/s (sampling) | tail ESS/s (sampling) "
                "| bulk ESS/s (c+s) | tail ESS/s (c+s) | H2 R-hat | max R-hat | min bulk / tail ESS | divergences "
                "| H2 mean [99% HDI] | load avg start / end |",
                "|" + "---|" * 20]
        for arm in ARMS:
            a = arms[arm]
            if a["completed"]:
                cs = a["compile_s"] + a["sampling_s"]
                h, c = a["h2"], a["convergence"]
                ms = 1000 * a["sampling_s"] / max(a["gradient_evaluations"], 1)
                out.append(
                    f"| {arm} | {fmt(a['compile_s'])} | {fmt(a['sampling_s'])} | {fmt(cs)} | {fmt(a['arm_wall_s'])} | "
                    f"{fmt(a['cpu_s'])} | {a['gradient_evaluations']:,} | {ms:.2f} | "
                    f"{h['ess_bulk']:.0f} | {h['ess_tail']:.0f} | {h['ess_bulk'] / a['sampling_s']:.3f} | "
                    f"{h['ess_tail'] / a['sampling_s']:.3f} | {h['ess_bulk'] / cs:.3f} | {h['ess_tail'] / cs:.3f} | "
                    f"{h['rhat']:.3f} | {c['max_rhat']:.3f} | {c['min_ess_bulk']:.0f} / {c['min_ess_tail']:.0f} | "
                    f"{c['divergences']} | {h['mean']:.3f} [{h['hdi_low']:.3f}, {h['hdi_high']:.3f}] | "
                    f"{a['loadavg_start'][0]:.2f} / {a['loadavg_end'][0]:.2f} |")
            else:
                p = a.get("partial", {})
                grads = p.get("gradient_evaluations_so_far")
                spg = p.get("seconds_per_gradient")
                out.append(f"| {arm} (capped) | {fmt(p.get('setup_s'))} | >= {fmt(p.get('sampling_so_far_s'))} "
                           f"(stopped) | >= {fmt(p.get('in_sample_call_s'))} | >= {a['parent_wall_s']:.0f} | "
                           f"{fmt(a['cpu_s'])} | {'-' if grads is None else f'{grads:,} (so far)'} | "
                           f"{'-' if spg is None else f'{1000 * spg:.2f}'} | - | - | - | - | - | - | - | - | - | "
                           f"{p.get('divergences_so_far', '-')} (so far) | - | - |")
        out += ["", "Ratios (ESS/s: nutpie / PyMC, above 1 favours nutpie; seconds: PyMC / nutpie, nutpie's "
                "speed-up):", ""]
        for key, r in res["ratios"].items():
            note = f" ({r['note']})" if r.get("note") else ""
            out.append(f"- {key}: {r['bound'] if r['bound'] != '=' else ''}{r['value']:.2f}{note}")
        for a in (a for a in arms.values() if not a["completed"]):
            p = a.get("partial", {})
            out += ["", f"{a['arm']} was stopped at its cap ({a['cap_s']:.0f} s for the whole arm process): "
                    f"iterations per chain {p.get('iterations_per_chain')} of {p.get('iterations_needed_per_chain')}; "
                    f"setup (compile, init) {fmt(p.get('setup_s'))} s; recent "
                    f"{fmt(p.get('iterations_per_s_recent'), 3)} iterations/s; extrapolated sampling time "
                    f"{fmt(p.get('extrapolated_sampling_s'), 0)} s (rough)."]
            if p.get("partial_h2"):
                h = p["partial_h2"]
                out.append(f"Its partial post-tuning draws ({h['chains']} chain(s) x {h['draws']}): H2 bulk ESS "
                           f"{h['ess_bulk']:.0f}, tail ESS {h['ess_tail']:.0f}, mean {h['mean']:.3f}.")
        out += ["", f"Last line: `{res['last_line']}`", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 frames x 2 depths (720 rows), 2 x (50 + 50), ~2 min")
    ap.add_argument("--frames-per-fear", type=int, help="default: full 10, quick 2")
    ap.add_argument("--depths", type=int, help="number of depths d1..dN (default: full 8, quick 2)")
    ap.add_argument("--band", help="comma-separated H2 band depths (default: full d4,d5; quick all)")
    ap.add_argument("--draws", type=int, help="draws per chain (default: full 200, quick 50)")
    ap.add_argument("--tune", type=int, help="tuning iterations per chain (default: full 200, quick 50)")
    ap.add_argument("--chains", type=int, help="chains (default: the registered sampler's, 2)")
    ap.add_argument("--budget", type=float, help="seconds for the whole run (default: full 1500, quick 420)")
    ap.add_argument("--nutpie-cap", type=float, help="seconds for the nutpie arm (default: full 900, quick 240)")
    ap.add_argument("--pymc-cores", type=int,
                    help="cores for pm.sample (default: PyMC's own default, min(4, logical CPUs // 2))")
    ap.add_argument("--nutpie-blas-threads", type=int, default=1,
                    help="BLAS threads in the nutpie arm (threadpoolctl); default 1, as primary_model.sample; "
                         "0: no limit (OpenBLAS's default, one per CPU)")
    ap.add_argument("--warm-cache", action="store_true",
                    help="use the user's PyTensor compile cache (default: each arm compiles into an empty one)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave results/ alone")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (logs, progress files)")
    ap.add_argument("--markdown", action="store_true", help="print the RESULTS.md section from fit.json and exit")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.arm:
        return run_arm(args)
    if args.markdown:
        print(render_markdown(json.loads(RESULTS_JSON.read_text())))
        return 0

    started = time.perf_counter()
    from fear_assets.core.hashing import derived_seed
    from fear_assets.core.settings import load_settings

    settings = load_settings()
    sampler = settings.sampler
    mode = "quick" if args.quick else "full"
    blas = args.nutpie_blas_threads
    variant = mode + ("" if blas == 1 else "+nutpie-blas-unlimited" if blas == 0 else f"+nutpie-blas{blas}") + \
        (f"+pymc-cores{args.pymc_cores}" if args.pymc_cores else "") + ("+warm-cache" if args.warm_cache else "")
    q = args.quick
    frames_per_fear = args.frames_per_fear or (2 if q else 10)
    n_depths = args.depths or (2 if q else 8)
    depths = [f"d{i}" for i in range(1, n_depths + 1)]
    band = args.band.split(",") if args.band else (depths if q else ["d4", "d5"])
    if not set(band) <= set(depths):
        raise SystemExit(f"band {band} not among the depths {depths}")
    budget = args.budget or (420.0 if q else 1500.0)
    spec = {"draws": args.draws or (50 if q else 200), "tune": args.tune or (50 if q else 200),
            "chains": args.chains or int(sampler.chains),
            "seed": derived_seed(settings.master_seed, "benchmarks/fit", "sampler") % (2**31),
            "data_seed": derived_seed(settings.master_seed, "benchmarks/fit", "data") % (2**32),
            "band": band, "hdi_prob": float(settings.decision.hdi_prob),
            "registered_sampler": {k: int(v) for k, v in sampler.items()}, "pymc_cores": args.pymc_cores,
            "nutpie_blas_threads": args.nutpie_blas_threads,
            "compile_cache": "user's PyTensor cache (warm)" if args.warm_cache else "empty, one per arm (cold)"}
    spec["levels"] = levels_for(settings.fears, depths)
    from pymc.sampling.parallel import _cpu_count

    spec["pymc_cores_effective"] = args.pymc_cores or min(4, _cpu_count())
    data = simulate(spec["levels"], frames_per_fear, spec["data_seed"])
    work = Path(tempfile.mkdtemp(prefix="fit_bench_"))
    data.to_pickle(work / "data.pkl")
    (work / "spec.json").write_text(json.dumps(spec))
    print(f"# {mode}: {len(data):,} rows, {data['frame'].nunique()} frames, {data['unit'].nunique():,} units; "
          f"{spec['chains']} chains x ({spec['tune']} tune + {spec['draws']} draws); budget {budget:.0f} s; "
          f"work dir {work}", flush=True)

    arms = {}
    caps = {"nutpie": min(args.nutpie_cap or (240.0 if q else 900.0), budget - MARGIN_S)}
    arms["nutpie"] = launch("nutpie", work, caps["nutpie"], not args.warm_cache)
    show(arms["nutpie"])
    if not arms["nutpie"]["completed"]:
        raise SystemExit(f"nutpie did not finish within its cap ({caps['nutpie']:.0f} s); raise --nutpie-cap "
                         f"or lower --draws/--tune (work dir {work})")
    caps["pymc"] = budget - (time.perf_counter() - started) - MARGIN_S
    arms["pymc"] = launch("pymc", work, caps["pymc"], not args.warm_cache)
    arms["pymc"].update(spec_draws=spec["draws"], spec_chains=spec["chains"])
    show(arms["pymc"])

    ratios = ratio_block(arms["nutpie"], arms["pymc"])
    def r(k):
        x = ratios.get(k)
        return "NA" if x is None else f"{'' if x['bound'] == '=' else x['bound']}{x['value']:.2f}"
    if arms["pymc"]["completed"]:
        last = (f"ess_per_s_ratio_tail={r('ess_per_s_tail_compile_plus_sampling')} "
                f"ess_per_s_ratio_bulk={r('ess_per_s_bulk_compile_plus_sampling')} "
                f"speedup_compile_plus_sampling={r('speedup_compile_plus_sampling')}")
    else:
        last = (f"ess_per_s_ratio_tail={r('ess_per_s_tail_compile_plus_sampling')} "
                f"ess_per_s_ratio_bulk={r('ess_per_s_bulk_compile_plus_sampling')} "
                f"speedup_compile_plus_sampling={r('speedup_compile_plus_sampling')} (PyMC capped)")
    command = shlex.join(["nice", "-n", "19", ".venv/bin/python", "benchmarks/fit.py",
                          *(sys.argv[1:] if argv is None else argv)])
    nut = arms["nutpie"]
    result = {
        "mode": mode, "variant": variant, "command": command, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "spec": {k: v for k, v in spec.items() if k != "levels"},
        "levels": spec["levels"],
        "data": {"rows": len(data), "frames": int(data["frame"].nunique()), "frames_per_fear": frames_per_fear,
                 "units": int(data["unit"].nunique()), "depths": depths, "fixed_effects": nut["n_fixed"],
                 "unconstrained_dim": nut["n_dim"], "true_effects": EFFECTS, "true_h2": TRUE_H2,
                 "frame_sd": FRAME_SD.tolist(), "unit_sd": UNIT_SD, "residual": f"{RESIDUAL_SCALE} * t({RESIDUAL_DF})"},
        "budget_s": budget, "caps": caps, "arms": arms, "ratios": ratios, "last_line": last,
        "wall_seconds": time.perf_counter() - started,
    }
    print()
    print(render_markdown({variant: result}))
    if not args.no_write:
        RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
        all_results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.is_file() else {}
        all_results[variant] = result
        RESULTS_JSON.write_text(json.dumps(finite(all_results), indent=2, default=float, allow_nan=False) + "\n")
    if args.keep:
        print(f"# kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(last)
    return 0


def finite(obj):
    """NaN and infinities as null, so that fit.json is strict JSON."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def show(a: dict) -> None:
    if a["completed"]:
        h, c = a["h2"], a["convergence"]
        print(f"{a['arm']:>6}: compile {a['compile_s']:7.1f} s  sampling {a['sampling_s']:7.1f} s  "
              f"arm wall {a['arm_wall_s']:7.1f} s  H2 ESS bulk {h['ess_bulk']:6.0f} tail {h['ess_tail']:6.0f}  "
              f"R-hat {h['rhat']:.3f}  max R-hat {c['max_rhat']:.3f}  div {c['divergences']}  "
              f"H2 {h['mean']:.3f} [{h['hdi_low']:.3f}, {h['hdi_high']:.3f}]", flush=True)
    else:
        p = a.get("partial", {})
        print(f"{a['arm']:>6}: CAPPED at {a['cap_s']:.0f} s; iterations per chain {p.get('iterations_per_chain')} "
              f"of {p.get('iterations_needed_per_chain')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
