"""The primary model's frame effects, non-centred vs centred on their fixed effects (D3b, issue 11).

Run (from the repository root; the machine is shared, so at low priority):

    nice -n 10 .venv/bin/python benchmarks/reparam.py            # registered size, 14,400 rows (~12 min)
    nice -n 10 .venv/bin/python benchmarks/reparam.py --quick    # 5 frames a fear x 2 depths (~3 min)

Both forms are ``analysis.primary_model.build_model`` (``frames="non_centred"`` and
``"centred"``): the same registered priors and likelihood (the prior-equivalence test is
``fear_assets_tests/test_reparametrisation.py``), so they have one posterior and differ only in
how NUTS sees it. Data: ``benchmarks/fit.py``'s registered-size generator (50 frames x 8
depths x 3 rotations x 2 orders x 6 cells) in two cases, the same seed in both forms:
  realistic  its variance components (frame SDs 0.15, 0.05, 0.05, 0.08, 0.03, 0.03; unit SD 0.1;
             Student-t(8) residual, scale 0.2);
  no_slopes  FACTS.md's hardest case: frame-slope SDs and the unit SD at zero (intercept 0.15).
Each fit: nutpie, registered 2 x (500 + 500), low-rank mass matrix, one BLAS thread, one
compilation timed apart. Figures: compile and sampling seconds (wall and CPU), mean leapfrog
steps per draw, divergences, H1-H3 bulk/tail ESS and R-hat, the number of model parameters
(intercept, beta, frame_chol, unit_sd, sigma, nu) missing the convergence rule, seconds to ESS
400 on the worst contrast, and the form ``analysis.parametrisation.frame_parametrisation`` picks
for the case. The last line printed is
``centred_speedup_realistic=<x> centred_speedup_no_slopes=<y> rule_realistic=<form> rule_no_slopes=<form>``
(speed-up: the non-centred form's seconds to ESS 400 on its worst contrast over the centred
form's). Results: ``benchmarks/results/reparam.json``. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402

RESULTS_JSON = ROOT / "benchmarks" / "results" / "reparam.json"
TARGET_ESS = 400
FORMS = ("non_centred", "centred")


def case_data(settings, case: str, frames_per_fear: int, depths: int, seed: int):
    import fit as fitbench

    from fear_assets.models.primary_model import prepare

    levels = fitbench.levels_for(settings.fears, [f"d{i}" for i in range(1, depths + 1)])
    saved = fitbench.FRAME_SD.copy(), fitbench.UNIT_SD
    if case == "no_slopes":
        fitbench.FRAME_SD, fitbench.UNIT_SD = np.array([saved[0][0], 0, 0, 0, 0, 0.0]), 0.0
    try:
        data = fitbench.simulate(levels, frames_per_fear, seed)
        sd, unit_sd = fitbench.FRAME_SD.copy(), fitbench.UNIT_SD
    finally:
        fitbench.FRAME_SD, fitbench.UNIT_SD = saved
    residual_sd = fitbench.RESIDUAL_SCALE * np.sqrt(fitbench.RESIDUAL_DF / (fitbench.RESIDUAL_DF - 2))
    return prepare(data, levels), sd, unit_sd, float(residual_sd)


def fit_one(d, priors, form: str, band, seed: int, draws: int, tune: int, chains: int, hdi_prob: float,
            rule: dict) -> dict:
    import arviz as az
    import nutpie

    from fear_assets.models.primary_model import (build_model, cell_means, hypotheses, one_blas_thread,
                                                    posterior_draws)

    t = time.perf_counter()
    compiled = nutpie.compile_pymc_model(build_model(d, priors, frames=form))
    compile_s = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    with one_blas_thread():
        idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, seed=seed, progress_bar=False,
                              low_rank_modified_mass_matrix=True)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)
    out = {"form": form, "compile_s": round(compile_s, 1), "sampling_s": round(wall, 1), "sampling_cpu_s": round(cpu, 1),
           "mean_leapfrog_steps": round(float(idata.sample_stats["n_steps"].mean()), 1),
           "divergences": int(idata.sample_stats["diverging"].sum()), "contrasts": {}}
    for name, draws_ in hypotheses(mu).items():
        x = np.asarray(draws_).reshape(chains, -1)
        low, high = az.hdi(x.reshape(-1), hdi_prob=hdi_prob)
        out["contrasts"][name] = {"mean": round(float(x.mean()), 4), "hdi": [round(float(low), 4), round(float(high), 4)],
                                  "ess_bulk": round(float(az.ess(x, method="bulk"))),
                                  "ess_tail": round(float(az.ess(x, method="tail"))), "rhat": round(float(az.rhat(x)), 4)}
    worst = min(min(v["ess_bulk"], v["ess_tail"]) for v in out["contrasts"].values())
    out["worst_contrast_ess"] = worst
    out["contrasts_meet_rule"] = all(min(v["ess_bulk"], v["ess_tail"]) >= rule["ess_bulk_min"]
                                     and v["rhat"] <= rule["rhat_max"] for v in out["contrasts"].values()) \
        and out["divergences"] <= rule["divergences_max"]
    out["s_to_ess_400_worst_contrast"] = round(wall * TARGET_ESS / max(worst, 1), 1)
    summary = az.summary(idata, var_names=["intercept", "beta", "frame_chol", "unit_sd", "sigma", "nu"],
                         kind="diagnostics")
    missing = (summary.ess_bulk < rule["ess_bulk_min"]) | (summary.ess_tail < rule["ess_tail_min"]) | \
              (summary.r_hat > rule["rhat_max"])
    out["parameters"], out["parameters_missing_rule"] = len(summary), int(missing.sum())
    out["worst_parameters"] = summary.sort_values("ess_bulk").head(3)[["ess_bulk", "ess_tail", "r_hat"]] \
        .round(3).to_dict("index")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 frames a fear x 2 depths (smoke run)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--cases", default="realistic,no_slopes")
    args = ap.parse_args(argv)

    from fear_assets.models.primary_model import Priors
    from fear_assets.core.settings import load_settings
    from fear_assets.models.parametrisation import frame_parametrisation

    settings = load_settings()
    s, conv = settings.sampler, settings.convergence
    rule = {"ess_bulk_min": conv.ess_bulk_min, "ess_tail_min": conv.ess_tail_min, "rhat_max": conv.rhat_max,
            "divergences_max": conv.divergences_max}
    frames_per_fear, depths = (1, 2) if args.quick else (10, 8)
    band = ["d1", "d2"] if args.quick else ["d4", "d5"]
    priors = Priors.from_settings(settings)
    out = {"quick": args.quick, "frames_per_fear": frames_per_fear, "depths": depths, "band": band, "seed": args.seed,
           "sampler": {"draws": s.draws, "tune": s.tune, "chains": s.chains}, "load_before": os.getloadavg(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cases": {}}
    for case in args.cases.split(","):
        d, sd, unit_sd, residual_sd = case_data(settings, case, frames_per_fear, depths, args.seed)
        picked = frame_parametrisation(d, settings.fitting.frame_parametrisation)  # the registered rule, on the data
        print(f"{case}: {len(d.y)} rows, frame SDs {sd.tolist()}, unit SD {unit_sd}; the rule picks {picked}", flush=True)
        arms = {}
        for form in FORMS:
            arms[form] = fit_one(d, priors, form, band, args.seed, s.draws, s.tune, s.chains,
                                 float(settings.decision.hdi_prob), rule)
            a = arms[form]
            print(f"  {form:<12} compile {a['compile_s']:6.1f} s  sampling {a['sampling_s']:6.1f} s  steps "
                  f"{a['mean_leapfrog_steps']:5.1f}  div {a['divergences']:3d}  worst contrast ESS {a['worst_contrast_ess']:5d}"
                  f"  s to ESS 400 {a['s_to_ess_400_worst_contrast']:6.1f}  params missing rule "
                  f"{a['parameters_missing_rule']}/{a['parameters']}", flush=True)
        out["cases"][case] = {"rows": len(d.y), "frame_sd": sd.tolist(), "unit_sd": unit_sd, "residual_sd": residual_sd,
                              "rule_picks": picked, "arms": arms,
                              "centred_speedup": round(arms["non_centred"]["s_to_ess_400_worst_contrast"]
                                                       / arms["centred"]["s_to_ess_400_worst_contrast"], 2)}
    out["load_after"] = os.getloadavg()
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    previous["quick" if args.quick else "full"] = out
    RESULTS_JSON.write_text(json.dumps(previous, indent=2) + "\n")
    c = out["cases"]
    print(" ".join([f"centred_speedup_{k}={v['centred_speedup']}" for k, v in c.items()]
                   + [f"rule_{k}={v['rule_picks']}" for k, v in c.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
