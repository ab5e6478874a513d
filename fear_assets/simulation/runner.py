"""Fitting simulated datasets with exactly the registered model and priors (protocol 6.3).

Every block is fitted by the analysis code's own model: the primary model
(``analysis.primary_model.build_model``; H1-H3, gates (a) and (b), H4 with its document
intercept), the joint two-block model (``analysis.joint``; controls 2-4 through
``controls.fit_control``, gate (c) through ``gate_c.prepare_gate_c``), the addressee control's
own fit (``fit_control``) and H5's probit (``h5_model.build_h5_model``). The PyMC models with
data containers are compiled once per shape and process (``Fitter``) and every dataset's
outcomes are swapped in with nutpie's ``with_data``: all datasets of a family and frame count
share the design, so one compilation per model serves every dataset. H5's model holds its
data as constants and compiles per dataset. Each reported contrast keeps its label,
HDI, R-hat, bulk/tail ESS and divergences; a fit that misses the registered convergence
rule is kept and flagged (``converged`` false), never dropped (D7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis import gate_c as gc
from fear_assets.analysis.controls import control_verdict, fit_control
from fear_assets.core.hashing import sampler_seed
from fear_assets.core.sections import Convergence
from fear_assets.models.data import AGENTS, CONTENTS, levels_of
from fear_assets.models.fits import contrast_summary, convergence_problems
from fear_assets.models.h5_model import H5Priors, build_h5_model, h5_contrast, prepare_h5
from fear_assets.models.primary_model import (
    Fitter,
    cell_means,
    divergences,
    frame_form_of,
    hypotheses,
    posterior_draws,
    sample,
)
from fear_assets.simulation import models
from fear_assets.simulation.design import SimulatedDesign
from fear_assets.simulation.generator import (
    PRIMARY_MODEL_BLOCKS,
    PilotEstimates,
    block_effects,
    gate_b_estimates,
    scenario_size,
    simulate_block,
    true_beta,
)
from fear_assets.simulation.models import pilot_residual_sd

#: Contrasts reported from each block.
REPORTED = {"primary": ("H1", "H2", "H3"), "recall": ("gate_b",), "service_relevance": ("gate_a",),
            "control_instructed_interaction": ("control_instructed_interaction",),
            "control_instructed_priority": ("control_instructed_priority",),
            "control_marked_priority": ("control_marked_priority",),
            "control_addressee_name": ("control_addressee_name",), "judge": ("gate_c",), "probe": ("H4",),
            "forced_choice": ("H5",)}
#: Blocks fitted jointly with the primary block's cells (and sharing its frame effects).
WITH_PRIMARY = ("control_instructed_interaction", "control_instructed_priority", "control_marked_priority", "judge")

#: Stored per contrast; timings stay out so the same inputs give byte-identical batch files.
LABEL_COLUMNS = ["family", "scenario", "frames", "dataset", "contrast", "truth", "mean", "hdi_low", "hdi_high",
                 "label", "practically_meaningful", "control_passed", "rhat", "ess_bulk", "ess_tail", "divergences",
                 "converged", "convergence_problems", "frame_parametrisation"]


@dataclass(frozen=True)
class Rules:
    """The registered numbers a simulated fit is judged by (from the protocol settings)."""

    hdi_prob: float
    sesoi: float
    meaningful: float
    convergence: Convergence
    control_min_mean: float
    control_hdi_above: float
    inflation: float
    #: Gate (c)'s registered reader-factor prior sd and H5's registered priors (None: those
    #: blocks cannot be fitted with these rules).
    reader_factor_sd: float | None = None
    h5_priors: object = None

    @classmethod
    def from_settings(cls, settings) -> "Rules":

        dec, ctrl = settings.decision, settings.positive_controls
        return cls(dec.hdi_prob, dec.sesoi, dec.meaningful, settings.convergence,
                   ctrl.pass_min_mean, ctrl.hdi_above, settings.power.slope_sd_inflation,
                   settings.priors.gate_c_reader_factor_sd, H5Priors.from_settings(settings))


def dataset_seed(master_seed: int, family: str, scenario: str, frames: int, dataset: int, purpose: str) -> int:
    """Every draw of the simulation derives from the registered master seed and its path."""
    return sampler_seed(master_seed, "power", family, scenario, frames, dataset, purpose)


def truths(scenario: str, rules: Rules, est: PilotEstimates) -> dict[str, float]:
    """The true value of every reported contrast in a scenario (gate (c) on its standardised
    scale: the tested model's H2 minus the judge's zero, over the pilot residual SD)."""

    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    out = {"H1": size, "H2": size, "H3": size, "H4": size, "H5": size, "gate_a": size, "gate_b": size,
           "gate_c": size / pilot_residual_sd(est)}
    out.update({f"control_{k}": v for k, v in est.controls.items()})
    return out


def not_simulated(est: PilotEstimates, blocks: Sequence[str]) -> dict[str, str]:
    """Contrasts whose blocks cannot be generated from these pilot estimates, with the reason
    (their targets are then reported as not computable, never as met)."""
    out = {}
    if "probe" in blocks and est.h4 is None:
        out["H4"] = "no pilot H4 (probe log-odds) estimates"
    if "forced_choice" in blocks and est.h5 is None:
        out["H5"] = "no pilot H5 (probit) estimates"
    for block in blocks:
        if block.startswith("control_") and block.removeprefix("control_") not in est.controls:
            out[block] = f"no pilot estimate of {block}"
    for block, contrasts in REPORTED.items():
        if block not in blocks:
            out.update({c: f"block {block} not in this run" for c in contrasts if c not in out})
    return out


def _label_row(family: str, scenario: str, frames: int, dataset: int, contrast: str, truth: float, draws: np.ndarray,
               chains: int, n_divergences: int, rules: Rules, rope: float | None = None,
               decision=None, frame_form: str | None = None) -> dict:
    row = contrast_summary(contrast, draws, chains, rules.hdi_prob, rules.sesoi, rope, divergences=n_divergences)
    if decision is not None:  # gate (c): its own rule on the standardised scale
        row["label"], row["practically_meaningful"] = decision(row["hdi_low"], row["hdi_high"])
    problems = convergence_problems(row, rules.convergence)
    passed = None
    if contrast.startswith("control_"):
        passed = control_verdict(contrast, draws, rules.hdi_prob, rules.control_min_mean, rules.control_hdi_above).passed
    return {"family": family, "scenario": scenario, "frames": frames, "dataset": dataset, "contrast": contrast,
            "truth": truth, "mean": row["mean"], "hdi_low": row["hdi_low"], "hdi_high": row["hdi_high"],
            "label": row["label"], "practically_meaningful": row["practically_meaningful"], "control_passed": passed,
            "rhat": row["rhat"], "ess_bulk": row["ess_bulk"], "ess_tail": row["ess_tail"],
            "divergences": row["divergences"], "converged": not problems,
            "convergence_problems": "; ".join(problems), "frame_parametrisation": frame_form}


def fit_dataset(fitter: Fitter, design: SimulatedDesign, est: PilotEstimates, rules: Rules, family: str,
                scenario: str, dataset: int, master_seed: int, blocks: Sequence[str] = tuple(PRIMARY_MODEL_BLOCKS)
                ) -> list[dict]:
    """Simulate and fit the blocks of one dataset (all of them unless ``blocks`` says
    otherwise; the controls 2-4 and gate (c) are joint fits with the primary block, so they
    need "primary"), each with its registered analysis model; one row per reported contrast.
    Blocks whose pilot estimates are missing (``not_simulated``) are skipped."""

    unknown = [b for b in blocks if b not in PRIMARY_MODEL_BLOCKS]
    if unknown:
        raise ValueError(f"unknown simulated block(s) {unknown}: use those of {', '.join(PRIMARY_MODEL_BLOCKS)}")
    if any(b in WITH_PRIMARY for b in blocks) and "primary" not in blocks:
        raise ValueError(f"blocks {list(blocks)}: the controls 2-4 and gate (c) are joint fits with the primary "
                         f"block; include 'primary'")
    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    truth = truths(scenario, rules, est)
    skip = not_simulated(est, blocks)
    d0, band, n = design.data, list(design.band), design.n_frames
    fears = list(d0.levels["fear"])
    rows: list[dict] = []
    rng_of = lambda block: np.random.default_rng(dataset_seed(master_seed, family, scenario, n, dataset, block))  # noqa: E731
    seed_of = lambda block: dataset_seed(master_seed, family, scenario, n, dataset, "fit:" + block)  # noqa: E731
    row = lambda contrast, draws, chains, div, **kw: _label_row(  # noqa: E731
        family, scenario, n, dataset, contrast, truth[contrast], draws, chains, div, rules, **kw)
    primary, frames = None, None
    for block in [b for b in PRIMARY_MODEL_BLOCKS if b in blocks]:
        if any(c in skip for c in REPORTED[block]):
            continue
        rng = rng_of(block)
        if block in ("primary", "recall", "service_relevance"):
            # Gate (b) at the pilot's recall fit (its own residual scale), the others at the report fit.
            gen = gate_b_estimates(est) if block == "recall" else est
            beta = true_beta(gen, d0, band, block_effects(block, size, est.controls)[0])
            if block == "primary":
                d, frames = models.shared_primary(design, est, beta, rules.inflation, rng)
                primary = d
            else:
                d = simulate_block(d0, gen, beta, 0.0, rules.inflation, rng)
            idata = fitter.fit(d, seed_of(block))
            chains = int(idata.posterior.sizes["chain"])
            h = hypotheses(cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band))
            draws = h if block == "primary" else {REPORTED[block][0]: h["H2"]}
            rows += [row(c, x, chains, divergences(idata), frame_form=frame_form_of(idata)) for c, x in draws.items()]
        elif block in ("control_instructed_interaction", "control_instructed_priority", "control_marked_priority"):
            effects, shift = block_effects(block, size, est.controls)
            control, matched = models.control_tables(design, est, primary, frames, effects, shift, rules.inflation,
                                                     rng)
            fit = fit_control(fitter, block.removeprefix("control_"), control, matched, fears, band, seed_of(block))
            rows.append(row(block, fit.draws, fit.chains, fit.diagnostics["divergences"]))
        elif block == "control_addressee_name":
            table = models.addressee_table(design.addressee, est, est.controls["addressee_name"], rules.inflation, rng)
            fit = fit_control(fitter, "addressee_name", table, table, fears, band, seed_of(block))
            rows.append(row(block, fit.draws, fit.chains, fit.diagnostics["divergences"]))
        elif block == "judge":
            sigma_t = models.pilot_residual_sd(est)
            sigma_j = sigma_t if est.judge_sigma is None else float(est.judge_sigma)
            judge = models.judge_table(design, est, frames, sigma_j, rules.inflation, rng)
            data = pd.concat([models.with_outcome(design, primary).assign(reader="tested"),
                              judge.assign(reader="judge")], ignore_index=True)

            d = gc.prepare_gate_c(data, levels_of(data, fears), {"tested": sigma_t, "judge": sigma_j},
                                  rules.reader_factor_sd, outcome="outcome")
            idata = fitter.fit(d, seed_of(block))  # build_gate_c_model = the joint model at these priors
            draws = gc.gate_c_contrast(idata, d, band)
            rope, _ = gc.gate_c_bounds(sigma_t, rules.sesoi, rules.meaningful)

            def decide_c(low, high):
                dec = gc.gate_c_decision(low, high, sigma_t, rules.sesoi, rules.meaningful)
                return dec.label, dec.practically_meaningful

            rows.append(row("gate_c", draws, int(idata.posterior.sizes["chain"]), divergences(idata), rope=rope,
                            decision=decide_c))
        elif block == "probe":
            table, d4 = models.h4_design(design)
            table = models.h4_table(table, d4, est, band, size, rules.inflation, rng)
            d = replace(d4, y=table["log_odds"].to_numpy(float))
            idata = fitter.fit(d, seed_of(block))
            h = hypotheses(cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band))
            rows.append(row("H4", h["H2"], int(idata.posterior.sizes["chain"]), divergences(idata),
                            frame_form=frame_form_of(idata)))
        elif block == "forced_choice":

            cells = [(a, c) for a in AGENTS for c in CONTENTS]  # as analysis.confirmatory.h5 orders them
            rows_h5 = models.h5_table(models.h5_rows(design, design.h5_depth), cells,
                                      models.H5Estimates.from_dict(est.h5), size, rules.inflation, rng)
            # The H5 model holds its data as constants (no data containers): compiled per dataset.
            idata = sample(build_h5_model(prepare_h5(rows_h5, cells), rules.h5_priors), fitter.draws, fitter.tune,
                           fitter.chains, seed_of(block))
            rows.append(row("H5", h5_contrast(idata, cells), int(idata.posterior.sizes["chain"]), divergences(idata)))
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
