"""The power simulation's fitting paths, side by side on the same datasets and seeds (6.3).

Run (from the repository root; the machine is shared, so at low priority):

    nice -n 10 .venv/bin/python benchmarks/power.py --quick   # small design, < 8 min on 2 quiet cores
    nice -n 10 .venv/bin/python benchmarks/power.py           # 50 frames x 8 depths (registered size; hours)
    nice -n 10 .venv/bin/python benchmarks/power.py --datasets 1 --b-cap 1200  # one registered-size dataset (~25 min)

Data. ``fear_assets.simulation``: the registered design (``simulated_design``) at the chosen
frame count and depths, outcomes of the primary block from ``simulate_block`` at fixed
synthetic pilot estimates (benchmarks/fit.py's variance components), scenario
``meaningful`` (H1 = H2 = H3 = 0.30); dataset i's outcomes and fit seeds are the same in
every arm.

Arms (the registered model and priors throughout, ``build_model``; the baselines evaluate mu
row by row, ``predictor="direct"``, as the model reads in 6.1):
  reference  compile once, 2 chains x (``--ref-tune`` + ``--ref-draws``) per dataset: the long run
             (non-centred, row by row: independent of both of (a)'s choices).
  a          this project's path, as ``power_simulation`` fits: compile once per shape and process,
             swap data per dataset (``with_data``), the registered sampler, mu evaluated per distinct
             design row (``predictor="cells"``, ``primary_model.design_cells``), the frame effects
             sampled as the registered rule picks on each dataset
             (``analysis.parametrisation.frame_parametrisation``: centred or non-centred, one posterior).
             With ``--a-warm-start`` (results key ``<quick|full>_warm_start``): chains warm-started
             from a fit on another dataset of the same design (unconstrained posterior mean as
             ``init_mean``, its step size as ``initial_step``) with ``--a-tune`` tuning steps.
  c          nutpie's compile-once ``with_data`` loop at the registered sampler settings.
  c_cells    (c) on (a)'s cells graph, non-centred: splits (a)/(c) into what the graph buys and
             what the centring buys.
  b          simuk-style: per dataset a fresh model (``pm.observe`` semantics: the observed
             data set anew) and ``pm.sample`` (PyMC's default NUTS, registered draws/tune/chains),
             recompiling every time; in a child process under ``--b-cap`` seconds (a capped run
             is a bound, said so).
  b_nutpie   the same recompile-per-dataset loop with nutpie (``primary_model.sample``).

Figures per arm: wall and CPU seconds per dataset (compile counted once per arm for a and c
and reported apart; in b it is in every dataset), the H2 contrast's bulk/tail ESS and R-hat,
seconds to ESS 400 (= seconds x 400 / min(bulk, tail ESS)), datasets per hour at equal ESS,
and the largest |99% HDI endpoint| difference of H1-H3 against the reference run on the same
dataset. The projection of the full registered simulation scales FACTS.md's measured
registered-size fit (2026-11-30: 19.5 s compile + 117 s sampling, 2 cores) by the measured
(a)/(c) time ratio; it is a projection, not a measurement. The last line printed is
``speedup_vs_recompile=<(a)/(b)> speedup_vs_with_data=<(a)/(c)> max_hdi_diff=<x>``.
No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

RESULTS_JSON = ROOT / "benchmarks" / "results" / "power.json"
TARGET_ESS = 400
#: Fits of one simulated dataset (runner.fit_dataset) in rows relative to the primary block: the
#: joint fits (controls 2-4, gate (c)) and H4 (two content versions) have twice its rows, the
#: addressee block 4 of its 6 cells; H5 reads one depth of the design (x2 with content-removed
#: trials), here at 8 depths. A projection assumption (cost proportional to rows), not a measurement.
PRIMARY_FIT_EQUIVALENTS = {"primary": 1.0, "recall": 1.0, "service_relevance": 1.0, "control_instructed_interaction": 2.0,
                           "control_instructed_priority": 2.0, "control_marked_priority": 2.0,
                           "control_addressee_name": 4 / 6, "judge": 2.0, "probe": 2.0, "forced_choice": 2 / 8}
#: FACTS.md, 2026-11-30: one registered-size primary fit, 2 x (500 + 500), nutpie, 2 cores.
FACTS_REGISTERED_FIT = {"compile_s": 19.5, "sampling_s": 117.0}
#: RESULTS.md "One H200": BlackJAX NUTS over 128 datasets' chains, seconds to ESS 400 per
#: registered-size primary dataset (2026-11-30; the candidate, not the registered path).
H200_CANDIDATE_S_TO_ESS400 = 1.25
#: The device machine that carries the H200 has 16 CPU cores (what the registered path, nutpie, runs on).
H200_HOST_CORES = 16


def estimates():
    from fear_assets.simulation.generator import PilotEstimates

    corr = np.eye(6)
    corr[0, 3] = corr[3, 0] = 0.3
    return PilotEstimates(-0.3, {}, (0.15, 0.05, 0.05, 0.08, 0.03, 0.03), tuple(map(tuple, corr)), 0.1, 0.2, 8.0,
                          (0.2, 0.2), {})


def datasets(settings, frames: int, depths: int, n: int):
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.generator import agent_effects, simulate_block, true_beta
    from fear_assets.simulation.runner import dataset_seed

    keys = [f"d{i}" for i in range(1, depths + 1)]
    band = keys[-2:] if depths >= 2 else keys
    design = simulated_design(settings, keys, band, frames, (0.2, 0.2), seed=1)
    est = estimates()
    beta = true_beta(est, design.data, design.band, agent_effects(float(settings.decision.meaningful)))
    out = []
    for i in range(-1, n):  # dataset -1: the warm start's reference dataset, never scored
        rng = np.random.default_rng(dataset_seed(settings.master_seed, "bench", "meaningful", frames, i, "primary"))
        out.append(simulate_block(design.data, est, beta, 0.0, 1.5, rng))
    return design, out[0], out[1:]


def contrasts(d, idata, band) -> dict:
    from fear_assets.models.primary_model import cell_means, hypotheses, posterior_draws

    chains = idata.posterior.sizes["chain"]
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), list(band))
    return {k: np.asarray(v).reshape(chains, -1) for k, v in hypotheses(mu).items()}


def stats(h: dict, hdi_prob: float) -> dict:
    import arviz as az

    out = {}
    for name, x in h.items():
        low, high = az.hdi(x.reshape(-1), hdi_prob=hdi_prob)
        out[name] = {"mean": float(x.mean()), "hdi_low": float(low), "hdi_high": float(high),
                     "ess_bulk": float(az.ess(x, method="bulk")), "ess_tail": float(az.ess(x, method="tail")),
                     "rhat": float(az.rhat(x))}
    return out


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - t, time.process_time() - c


def loop_arm(name: str, fitter, data, band, hdi_prob: float, seeds, log) -> dict:
    """Compile (first call, timed apart on a throw-away fit is not needed: compile is timed
    by compiling before the loop), then fit every dataset through the compiled model."""
    _, compile_s, compile_cpu = timed(lambda: fitter.compiled_for(data[0]))
    rows = []
    for i, (d, seed) in enumerate(zip(data, seeds)):
        idata, wall, cpu = timed(lambda: fitter.fit(d, seed))
        s = stats(contrasts(d, idata, band), hdi_prob)
        rows.append({"dataset": i, "wall_s": wall, "cpu_s": cpu, "contrasts": s,
                     "divergences": int(idata.sample_stats["diverging"].values.sum())})
        log(f"  {name} dataset {i}: {wall:.1f} s, H2 ESS bulk/tail {s['H2']['ess_bulk']:.0f}/{s['H2']['ess_tail']:.0f}")
    return {"compile_s": compile_s, "compile_cpu_s": compile_cpu, "fits": rows}


def child_b(workdir: str) -> int:
    """Arm b in its own process: fresh model and pm.sample per dataset (recompiling)."""
    import pymc as pm

    from fear_assets.models.primary_model import Priors, build_model
    from fear_assets.core.settings import load_settings

    spec = json.loads((Path(workdir) / "spec.json").read_text())
    data = pickle.loads((Path(workdir) / "data.pkl").read_bytes())
    priors = Priors.from_settings(load_settings())
    out = Path(workdir) / "b.jsonl"
    for i, d in enumerate(data):
        t, c = time.perf_counter(), time.process_time()
        with build_model(d, priors, predictor="direct"):
            idata = pm.sample(draws=spec["draws"], tune=spec["tune"], chains=spec["chains"], random_seed=spec["seeds"][i],
                              progressbar=False, compute_convergence_checks=False)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        s = stats(contrasts(d, idata, spec["band"]), spec["hdi_prob"])
        with out.open("a") as f:
            f.write(json.dumps({"dataset": i, "wall_s": wall, "cpu_s": cpu, "contrasts": s,
                                "divergences": int(idata.sample_stats["diverging"].values.sum())}) + "\n")
    return 0


def arm_b(data, band, spec: dict, cap: float, log) -> dict:
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "spec.json").write_text(json.dumps({**spec, "band": list(band)}))
        (Path(work) / "data.pkl").write_bytes(pickle.dumps(data))
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--child-b", work], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=cap)
            capped = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            capped = True
        elapsed = time.perf_counter() - t
        path = Path(work) / "b.jsonl"
        fits = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    log(f"  b: {len(fits)} dataset(s) in {elapsed:.0f} s{' (CAPPED)' if capped else ''}")
    return {"fits": fits, "capped": capped, "elapsed_s": elapsed, "compile_s": 0.0}


def per_dataset(arm: dict, hdi_key: str = "H2") -> dict:
    """Mean seconds per dataset and seconds to ESS 400 for H2 (compile excluded for a, c)."""
    fits = arm["fits"]
    if not fits:
        return {"wall_s": float("nan"), "s_to_ess400": float("nan"), "datasets_per_hour": float("nan")}
    wall = float(np.mean([f["wall_s"] for f in fits]))
    cpu = float(np.mean([f["cpu_s"] for f in fits]))
    ess = float(np.mean([min(f["contrasts"][hdi_key]["ess_bulk"], f["contrasts"][hdi_key]["ess_tail"]) for f in fits]))
    s_eq = wall * TARGET_ESS / ess
    return {"wall_s": wall, "cpu_s": cpu, "min_ess_h2": ess, "s_to_ess400": s_eq, "datasets_per_hour": 3600.0 / s_eq,
            "cpu_s_to_ess400": cpu * TARGET_ESS / ess}


def max_hdi_diff(arm: dict, ref: dict) -> float:
    diffs = [abs(f["contrasts"][h][k] - r["contrasts"][h][k]) for f, r in zip(arm["fits"], ref["fits"])
             for h in ("H1", "H2", "H3") for k in ("hdi_low", "hdi_high")]
    return float(max(diffs)) if diffs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--frames", type=int)
    ap.add_argument("--depths", type=int)
    ap.add_argument("--datasets", type=int)
    ap.add_argument("--ref-draws", type=int, default=2000)
    ap.add_argument("--ref-tune", type=int, default=1000)
    ap.add_argument("--a-tune", type=int, default=150, help="tuning steps of arm (a) with --a-warm-start")
    ap.add_argument("--a-warm-start", action="store_true",
                    help="arm (a) warm-started from a fit on another dataset (init_mean, step size; --a-tune steps)")
    ap.add_argument("--b-cap", type=float)
    ap.add_argument("--child-b")
    args = ap.parse_args()
    if args.child_b:
        return child_b(args.child_b)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from fear_assets.models.primary_model import Fitter, Priors
    from fear_assets.core.settings import load_settings
    from fear_assets.simulation.sampling import WarmStartFitter, warm_start_from

    settings = load_settings()
    frames = args.frames or (5 if args.quick else 50)
    depths = args.depths or (2 if args.quick else 8)
    n = args.datasets or (2 if args.quick else 5)
    cap = args.b_cap or (150.0 if args.quick else 3600.0)
    sampler = settings.sampler
    draws, tune, chains = int(sampler.draws), int(sampler.tune), int(sampler.chains)
    hdi_prob = float(settings.decision.hdi_prob)
    log = lambda m: print(m, flush=True)
    load = os.getloadavg()
    started = time.perf_counter()
    design, warm_data, data = datasets(settings, frames, depths, n)
    band = design.band
    seeds = [1000 + i for i in range(n)]
    priors = Priors.from_settings(settings)
    log(f"design: {frames} frames x {depths} depths = {design.rows} rows; {n} datasets; load {load}")

    ref_fitter = WarmStartFitter(priors, args.ref_draws, args.ref_tune, chains, store_unconstrained=True,
                                 cache=[], predictor="direct")  # each arm compiles (and is timed) apart
    log("reference (long run)")
    ref = loop_arm("reference", ref_fitter, data, band, hdi_prob, seeds, log)
    log("c: nutpie compile-once with_data loop, registered settings")
    c = loop_arm("c", Fitter(priors, draws, tune, chains, cache=[], predictor="direct"), data, band, hdi_prob,
                 seeds, log)
    log("c_cells: the same loop on the cells graph (non-centred)")
    c_cells = loop_arm("c_cells", Fitter(priors, draws, tune, chains, cache=[], predictor="cells"), data, band,
                       hdi_prob, seeds, log)
    # The project's path samples each dataset's frame effects as the registered rule picks on
    # that dataset (analysis.parametrisation; the same posterior either way, D3b).
    rule = settings.fitting.frame_parametrisation
    a_frames = "by the registered rule per dataset"
    if args.a_warm_start:
        log(f"a: compile once + with_data + warm start from a fit on another dataset; frame effects {a_frames}")
        # A warm start lives in one form's unconstrained space: the form the rule picks on the
        # reference dataset is kept for every dataset of the arm.
        from fear_assets.models.parametrisation import frame_parametrisation

        a_frames = frame_parametrisation(warm_data, rule)
        a_fitter = WarmStartFitter(priors, draws, args.a_tune, chains, store_unconstrained=True, cache=[],
                                   frames=a_frames)
        warm_idata, warm_s, _ = timed(lambda: a_fitter.fit(warm_data, 999))
        a_fitter.warm, a_fitter.store_unconstrained = warm_start_from(warm_idata), False
    else:
        log(f"a: the power simulation's path (compile once + with_data, registered sampler); frame effects {a_frames}")
        a_fitter, warm_s = Fitter(priors, draws, tune, chains, cache=[], rule=rule), 0.0
    a = loop_arm("a", a_fitter, data, band, hdi_prob, seeds, log)
    a["warm_start_fit_s"] = warm_s
    a["frame_effects"] = a_frames
    log("b_nutpie: recompile per dataset with nutpie")

    def recompile_nutpie():
        from fear_assets.models.primary_model import build_model, sample

        rows = []
        for i, (d, seed) in enumerate(zip(data[:1], seeds)):
            idata, wall, cpu = timed(lambda: sample(build_model(d, priors, predictor="direct"), draws, tune, chains,
                                                    seed))
            rows.append({"dataset": i, "wall_s": wall, "cpu_s": cpu, "contrasts": stats(contrasts(d, idata, band), hdi_prob)})
            log(f"  b_nutpie dataset {i}: {wall:.1f} s")
        return {"fits": rows}

    b_nutpie = recompile_nutpie()
    log(f"b: simuk-style pm.observe/pm.sample per dataset (PyMC NUTS), cap {cap:.0f} s")
    b = arm_b(data[:1], band, {"draws": draws, "tune": tune, "chains": chains, "seeds": seeds, "hdi_prob": hdi_prob},
              cap, log)

    pa, pb, pc, pbn = per_dataset(a), per_dataset(b), per_dataset(c), per_dataset(b_nutpie)
    pcc = per_dataset(c_cells)
    if b["capped"] and not b["fits"]:
        # capped before finishing one dataset: its time is at least the cap, its ESS at most N draws
        pb = {"wall_s": cap, "s_to_ess400": cap * TARGET_ESS / (draws * chains), "lower_bound": True}
        pb["datasets_per_hour"] = 3600.0 / pb["s_to_ess400"]
    ratio_b = pa["datasets_per_hour"] / pb["datasets_per_hour"]
    # On a shared machine wall time follows the others' load; CPU seconds (all of the process's
    # threads) do not, so the (a)/(c) ratio is also given on CPU seconds to equal ESS.
    ratio_c = pa["datasets_per_hour"] / pc["datasets_per_hour"]
    ratio_c_cpu = pc["cpu_s_to_ess400"] / pa["cpu_s_to_ess400"]
    hdi_a, hdi_c, hdi_cc = max_hdi_diff(a, ref), max_hdi_diff(c, ref), max_hdi_diff(c_cells, ref)
    # Projection: full registered simulation = 2,000 datasets x 3 scenarios x the fits of one dataset,
    # per frame count, in primary-fit equivalents (cost taken as proportional to rows: see
    # PRIMARY_FIT_EQUIVALENTS); one fit = FACTS' registered-size fit scaled by the measured a/c ratio.
    fits_per_frame_count = (settings.power.datasets * len(settings.power.scenarios)
                            * sum(PRIMARY_FIT_EQUIVALENTS.values()))
    t_c = FACTS_REGISTERED_FIT["sampling_s"]
    t_a = t_c * pa["wall_s"] / pc["wall_s"]
    projection = {
        "fits_per_frame_count": fits_per_frame_count, "fit_s_path_c_registered_size": t_c,
        "fit_s_path_a_registered_size_projected": t_a,
        "this_machine_2_cores_days": fits_per_frame_count * t_a / 86400,
        "64_cores_days": fits_per_frame_count * t_a / 32 / 86400,
        "h200_host_registered_path_days": fits_per_frame_count * t_a / (H200_HOST_CORES // 2) / 86400,
        "h200_candidate_days": fits_per_frame_count * H200_CANDIDATE_S_TO_ESS400 / 86400,
        "h200": f"projected, not measured: the registered path (nutpie) runs on the GPU host's CPUs, "
                f"{H200_HOST_CORES} cores = {H200_HOST_CORES // 2} fits at once; the BlackJAX candidate's "
                f"{H200_CANDIDATE_S_TO_ESS400} s to ESS 400 per registered-size primary "
                "dataset (measured on one H200, RESULTS.md 'One H200') applied to every fit, a path that is "
                "not the registered one until its HDIs match a long run",
        "how": "FACTS.md registered-size nutpie fit (117 s sampling, 2 cores) x measured (a)/(c) time ratio at the "
               "benchmark's size; one fit uses 2 chains on 2 cores, so 64 cores run 32 fits at once (linear "
               "scaling assumed); per frame count (50..100: up to 6 counts); every model of a dataset as "
               "PRIMARY_FIT_EQUIVALENTS primary fits (cost proportional to rows)",
    }
    result = {"variant": ("quick" if args.quick else "full") + ("_warm_start" if args.a_warm_start else ""), "frames": frames, "depths": depths, "rows": design.rows,
              "datasets": n, "sampler": {"draws": draws, "tune": tune, "chains": chains},
              "reference": {"draws": args.ref_draws, "tune": args.ref_tune}, "a_tune": args.a_tune,
              "load_before": load, "load_after": os.getloadavg(), "wall_total_s": time.perf_counter() - started,
              "per_dataset": {"a": pa, "b": pb, "c": pc, "c_cells": pcc, "b_nutpie": pbn},
              "compile_s": {"a": a["compile_s"], "c": c["compile_s"], "c_cells": c_cells["compile_s"],
                            "reference": ref["compile_s"]},
              "b_capped": b["capped"], "max_hdi_diff_vs_reference": {"a": hdi_a, "c": hdi_c, "c_cells": hdi_cc},
              "speedup_vs_recompile": ratio_b, "speedup_vs_with_data": ratio_c,
              "speedup_vs_with_data_cpu": ratio_c_cpu, "projection": projection,
              "arms": {"reference": ref, "a": a, "c": c, "c_cells": c_cells, "b": b, "b_nutpie": b_nutpie}}
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    existing[result["variant"]] = result
    RESULTS_JSON.write_text(json.dumps(existing, indent=2, default=float) + "\n")
    for k, v in result["per_dataset"].items():
        log(f"{k:>9}: {v}")
    log(f"max |HDI diff| vs reference: a {hdi_a:.4f}, c {hdi_c:.4f}, c_cells {hdi_cc:.4f}; "
        f"projection: {json.dumps(projection)}")
    log(f"(a)/(c) on CPU seconds to ESS 400: {ratio_c_cpu:.2f}")
    log(f"speedup_vs_recompile={ratio_b:.2f}{'(bound)' if pb.get('lower_bound') else ''} "
        f"speedup_vs_with_data={ratio_c:.2f} max_hdi_diff={hdi_a:.4f}")
    return 0


def markdown(variant: str = "quick") -> str:
    """A RESULTS.md section from benchmarks/results/power.json (``--markdown``)."""
    r = json.loads(RESULTS_JSON.read_text())[variant]
    lines = ["| arm | s/dataset (wall) | CPU s/dataset | min H2 ESS (bulk, tail) | s to ESS 400 | datasets/h at ESS 400 |",
             "|---|---|---|---|---|---|"]
    names = {"a": "(a) compile once + with_data + warm start" if variant.endswith("_warm_start")
             else "(a) the simulation's path (with_data, registered sampler, its frame parametrisation)",
             "c": "(c) nutpie with_data loop", "c_cells": "(c') the with_data loop on the cells graph",
             "b": "(b) simuk-style pm.sample, recompiling", "b_nutpie": "(b') nutpie, recompiling"}
    for k in ("a", "c", "c_cells", "b", "b_nutpie"):
        if k not in r["per_dataset"]:
            continue  # a result from before the arm existed
        p = r["per_dataset"][k]
        lines.append(f"| {names[k]} | {p.get('wall_s', float('nan')):.1f} | {p.get('cpu_s', float('nan')):.1f} | "
                     f"{p.get('min_ess_h2', float('nan')):.0f} | {p['s_to_ess400']:.1f} | {p['datasets_per_hour']:.1f}"
                     f"{' (bound)' if p.get('lower_bound') else ''} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--markdown" in sys.argv:
        print(markdown(sys.argv[-1] if sys.argv[-1] != "--markdown" else "quick"))
        sys.exit(0)
    sys.exit(main())
