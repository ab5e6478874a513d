"""Fitting simulated datasets with exactly the registered model and priors (protocol 6.3).

The registered PyMC model (``analysis.primary_model.build_model``) is compiled once per
shape and process (``Fitter``) and every dataset's outcomes are swapped in with nutpie's
``with_data``: all datasets of a family and frame count share the design, so one
compilation serves every block of every dataset. Each reported contrast keeps its label,
HDI, R-hat, bulk/tail ESS and divergences; a fit that misses the registered convergence
rule is kept and flagged (``converged`` false), never dropped (D7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.controls import CONTRASTS, control_verdict
from fear_assets.analysis.fits import contrast_summary, convergence_problems
from fear_assets.analysis.primary_model import Fitter, cell_means, divergences, hypotheses, posterior_draws
from fear_assets.hashing import derived_seed
from fear_assets.simulation.design import SimulatedDesign
from fear_assets.simulation.generator import (PRIMARY_MODEL_BLOCKS, PilotEstimates, block_effects, scenario_size,
                                              simulate_block, true_beta)

#: Contrasts reported from each block.
REPORTED = {"primary": ("H1", "H2", "H3"), "recall": ("gate_b",), "service_relevance": ("gate_a",),
            "control_instructed_interaction": ("control_instructed_interaction",),
            "control_instructed_priority": ("control_instructed_priority",),
            "control_marked_priority": ("control_marked_priority",)}

#: Stored per contrast; timings stay out so the same inputs give byte-identical batch files.
LABEL_COLUMNS = ["family", "scenario", "frames", "dataset", "contrast", "truth", "mean", "hdi_low", "hdi_high",
                 "label", "practically_meaningful", "control_passed", "rhat", "ess_bulk", "ess_tail", "divergences",
                 "converged", "convergence_problems"]


@dataclass(frozen=True)
class Rules:
    """The registered numbers a simulated fit is judged by (from the protocol settings)."""

    hdi_prob: float
    sesoi: float
    meaningful: float
    convergence: Mapping[str, float]
    control_min_mean: float
    control_hdi_above: float
    inflation: float

    @classmethod
    def from_settings(cls, settings) -> "Rules":
        dec, ctrl = settings.decision, settings.section("positive_controls")
        return cls(float(dec["hdi_prob"]), float(dec["sesoi"]), float(dec["meaningful"]),
                   dict(settings.section("convergence")), float(ctrl["pass_min_mean"]), float(ctrl["hdi_above"]),
                   float(settings.section("power")["slope_sd_inflation"]))


def dataset_seed(master_seed: int, family: str, scenario: str, frames: int, dataset: int, purpose: str) -> int:
    """Every draw of the simulation derives from the registered master seed and its path."""
    return derived_seed(master_seed, "power", family, scenario, frames, dataset, purpose) % (2**31)


def truths(scenario: str, rules: Rules, est: PilotEstimates) -> dict[str, float]:
    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    out = {"H1": size, "H2": size, "H3": size, "gate_a": size, "gate_b": size}
    out.update({f"control_{k}": v for k, v in est.controls.items()})
    return out


def fit_dataset(fitter: Fitter, design: SimulatedDesign, est: PilotEstimates, rules: Rules, family: str,
                scenario: str, dataset: int, master_seed: int, blocks: Sequence[str] = tuple(PRIMARY_MODEL_BLOCKS)
                ) -> list[dict]:
    """Simulate and fit the primary-model blocks of one dataset (all of them unless ``blocks``
    says otherwise; the controls need "primary"); one row per reported contrast."""
    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    truth = truths(scenario, rules, est)
    d0, band = design.data, list(design.band)
    rows, mus = [], {}
    if any(b.startswith("control_") for b in blocks) and "primary" not in blocks:
        raise ValueError(f"blocks {list(blocks)}: the controls are contrasts against the primary block; include 'primary'")
    for block in [b for b in PRIMARY_MODEL_BLOCKS if b in blocks]:
        effects, shift = block_effects(block, size, est.controls)
        beta = true_beta(est, d0, band, effects)
        rng = np.random.default_rng(dataset_seed(master_seed, family, scenario, design.n_frames, dataset, block))
        d = simulate_block(d0, est, beta, shift, rules.inflation, rng)
        idata = fitter.fit(d, dataset_seed(master_seed, family, scenario, design.n_frames, dataset, "fit:" + block))
        chains = int(idata.posterior.sizes["chain"])
        mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)
        mus[block] = mu
        if block == "primary":
            draws = hypotheses(mu)
        elif block in ("recall", "service_relevance"):
            draws = {REPORTED[block][0]: hypotheses(mu)["H2"]}
        else:
            name = block.removeprefix("control_")
            draws = {block: CONTRASTS[name](mu, mus["primary"])}
        for contrast, x in draws.items():
            row = contrast_summary(contrast, x, chains, rules.hdi_prob, rules.sesoi, divergences=divergences(idata))
            problems = convergence_problems(row, rules.convergence)
            passed = None
            if contrast.startswith("control_"):
                passed = control_verdict(contrast, x, rules.hdi_prob, rules.control_min_mean,
                                         rules.control_hdi_above).passed
            rows.append({"family": family, "scenario": scenario, "frames": design.n_frames, "dataset": dataset,
                         "contrast": contrast, "truth": truth[contrast], "mean": row["mean"],
                         "hdi_low": row["hdi_low"], "hdi_high": row["hdi_high"], "label": row["label"],
                         "practically_meaningful": row["practically_meaningful"], "control_passed": passed,
                         "rhat": row["rhat"], "ess_bulk": row["ess_bulk"], "ess_tail": row["ess_tail"],
                         "divergences": row["divergences"], "converged": not problems,
                         "convergence_problems": "; ".join(problems)})
    return rows


def run_batch(fitter: Fitter, design: SimulatedDesign, est: PilotEstimates, rules: Rules, family: str,
              scenario: str, datasets: range, master_seed: int, log=lambda message: None,
              blocks: Sequence[str] = tuple(PRIMARY_MODEL_BLOCKS)) -> pd.DataFrame:
    """One batch of datasets (the unit of a ``power_simulation`` partition) as a label table."""
    rows = []
    for i in datasets:
        t = time.perf_counter()
        rows += fit_dataset(fitter, design, est, rules, family, scenario, i, master_seed, blocks)
        log(f"{family} {scenario} {design.n_frames} frames: dataset {i} fitted in {time.perf_counter() - t:.1f} s")
    return pd.DataFrame(rows, columns=LABEL_COLUMNS)
