"""Positive-control fits at the embedded demo's size: separate posteriors (the former rule)
vs one joint fit per control (protocol 4.6, D4; issue 10 part A), side by side; and gate
(c)'s joint two-reader model at the same size.

Run (from the repository root; the machine is shared, so at low priority):

    nice -n 10 .venv/bin/python benchmarks/joint_fits.py

Data. Synthetic model tables of the embedded demo's size (the pilot_controls asset's inputs
at the demo's registered settings: one pilot frame, depths d1 and d2, both in the band;
3 rotations x 2 orders x 6 cells = 72 trials per block, 48 for the addressee control's four
cells), seeded: frame intercept 0.3, unit intercepts sd 0.1, Student-t(8) residuals scale
0.2, a +0.3 shift in every control cell (+0.3 on the addressee cells).

Arms, each in its own process with its own empty PyTensor compile directory (cold compile),
with the registered sampler settings (``sampler`` in the settings: draws, tune, chains):
  separate  pilot_controls before the correction: the primary model on pilot_primary at the
            band depths, then each control block on its own (``fit_cells``), contrasts as
            differences of the two posteriors' band means.
  joint     pilot_controls after it: the primary model on pilot_primary over all pilot
            depths (gate (c)'s sigma; here the same data, since the demo's band is both
            depths), the addressee control on its own cells, and one joint fit per other
            control (``controls.fit_control``).
  gate_c    the joint two-reader model (``gate_c``) on two demo-size blocks (not run by the
            demo, which scores no judge block; timed for the record).

Figures per arm: wall seconds of the fits (model building, compiling, sampling), model
compilations, and per control the contrast's mean and 99% HDI width. Written to
``benchmarks/results/joint_fits.json`` with each arm's process wall and CPU seconds; the last
line printed is ``joint_over_separate_seconds=<ratio> joint_over_separate_cpu_seconds=<ratio>``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FEARS = ["termination", "uncertainty", "isolation", "inferiority", "identity_loss"]
CELLS = list(itertools.product(("self", "peer", "person"), ("threat", "harmless")))
ADDRESSEE_CELLS = list(itertools.product(("addressee", "other_person"), ("threat", "harmless")))


def table(seed: int, cells=CELLS, shift: float = 0.0, depths=("d1", "d2"), covariates: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for rot, order, depth in itertools.product((1, 2, 3), (1, 2), depths):
        u = rng.normal(0, 0.1)
        for cell, (agent, content) in enumerate(cells, start=1):
            option = 1 if (rot + 3 * (order - 1) + int(depth[1:]) + cell) % 2 == 0 else 2
            row = {"agent": agent, "content": content, "depth": depth, "order": order, "option": option,
                   "rotation": rot, "fear": "termination", "frame": "TER-01", "item_id": "TER-01",
                   "unit": f"TER-01|r{rot}|o{order}|{depth}",
                   "outcome": 0.3 + shift + u + 0.2 * rng.standard_t(8)}
            if covariates:
                row.update(surprisal_name=rng.normal(0, 0.1), surprisal_rest=rng.normal(0, 0.1))
            rows.append(row)
    return pd.DataFrame(rows)


def arm(name: str) -> dict:
    import arviz as az

    from fear_assets.analysis.controls import CONTRASTS, fit_control
    from fear_assets.models.fits import fit_cells
    from fear_assets.models.primary_model import Fitter, Priors
    from fear_assets.core.settings import load_settings

    settings = load_settings()
    sampler = settings.sampler
    fitter = Fitter(Priors.from_settings(settings), int(sampler.draws), int(sampler.tune), int(sampler.chains),
                    cache=[])  # the arm counts its own compilations
    hdi = float(settings.decision.hdi_prob)
    band = ["d1", "d2"]
    primary = table(1)
    blocks = {"addressee_name": table(2, ADDRESSEE_CELLS, 0.0, covariates=False).assign(
                  outcome=lambda d: d.outcome + np.where(d.agent == "addressee", 0.3, 0.0)),
              "instructed_interaction": table(3, shift=0.3), "instructed_priority": table(4, shift=0.3),
              "marked_priority": table(5, shift=0.3)}
    out = {"arm": name, "controls": {}}
    started = time.perf_counter()
    if name == "separate":
        p = fit_cells(fitter, primary, FEARS, band, 11, "pilot_primary")
        for control, data in blocks.items():
            agents = ("addressee", "other_person") if control == "addressee_name" else ("self", "peer", "person")
            cov = () if control == "addressee_name" else ("surprisal_name", "surprisal_rest")
            f = fit_cells(fitter, data, FEARS, band, 12, control, agents, covariates=cov)
            draws = CONTRASTS[control](f.mu, p.mu)
            low, high = az.hdi(draws, hdi_prob=hdi)
            out["controls"][control] = {"mean": float(draws.mean()), "hdi_width": float(high - low)}
    elif name == "joint":
        fit_cells(fitter, primary, FEARS, band, 11, "pilot_primary")  # gate (c)'s sigma, all pilot depths
        for control, data in blocks.items():
            f = fit_control(fitter, control, data, primary, FEARS, band, 12)
            low, high = az.hdi(f.draws, hdi_prob=hdi)
            out["controls"][control] = {"mean": float(f.draws.mean()), "hdi_width": float(high - low)}
    else:
        from fear_assets.analysis.gate_c import GateCPriors, build_gate_c_model, gate_c_contrast, prepare_gate_c
        from fear_assets.models.primary_model import sample
        from fear_assets.models.data import levels_of

        priors = GateCPriors.from_settings(settings)
        data = pd.concat([primary.assign(reader="tested"), table(6).assign(reader="judge")], ignore_index=True)
        d = prepare_gate_c(data, levels_of(data, FEARS), {"tested": 0.25, "judge": 0.25}, priors.reader_factor_sd,
                           outcome="outcome")
        idata = sample(build_gate_c_model(d, priors), int(sampler.draws), int(sampler.tune),
                       int(sampler.chains), 13)
        draws = gate_c_contrast(idata, d, band)
        low, high = az.hdi(draws, hdi_prob=hdi)
        out["controls"]["gate_c"] = {"mean": float(draws.mean()), "hdi_width": float(high - low)}
        fitter.compilations = 1
    out["seconds"] = time.perf_counter() - started
    out["compilations"] = fitter.compilations
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", choices=["separate", "joint", "gate_c"])
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm)))
        return
    load = os.getloadavg()
    results = []
    for name in ("separate", "joint", "gate_c"):
        with tempfile.TemporaryDirectory() as compiledir:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTENSOR_FLAGS": f"compiledir={compiledir}",
                   "OMP_NUM_THREADS": "1"}
            started = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, __file__, "--arm", name], env=env, capture_output=True, text=True,
                                  cwd=ROOT, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_seconds"] = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # CPU seconds of the arm's process (user + system): less sensitive to the shared
            # machine's load than wall seconds.
            result["process_cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            results.append(result)
            print(json.dumps(result))
    by = {r["arm"]: r for r in results}
    ratio = by["joint"]["seconds"] / by["separate"]["seconds"]
    cpu_ratio = by["joint"]["process_cpu_seconds"] / by["separate"]["process_cpu_seconds"]
    record = {"command": "nice -n 10 .venv/bin/python benchmarks/joint_fits.py",
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average_at_start": load,
              "load_average_at_end": os.getloadavg(), "arms": results, "joint_over_separate_seconds": ratio,
              "joint_over_separate_cpu_seconds": cpu_ratio}
    path = ROOT / "benchmarks" / "results" / "joint_fits.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"joint_over_separate_seconds={ratio:.2f} joint_over_separate_cpu_seconds={cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
