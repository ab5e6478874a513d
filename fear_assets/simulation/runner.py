"""Fitting simulated datasets with exactly the registered model and priors (protocol 6.3).

Every block is fitted by the analysis code's own model: the primary model
(``analysis.primary_model.build_model``; H1-H3, gates (a) and (b), H4 with its document
intercept), the joint two-block model (``analysis.joint``; controls 2-4 through
``controls.control_data``, gate (c) through ``gate_c.prepare_gate_c``), the addressee control's
own fit (``control_data``) and H5's probit (``h5_model.build_h5_model``); what each block's data
are and how its contrasts are read is ``simulation.blocks`` (one copy, which the accelerator
path fits too). The PyMC models with
data containers are compiled once per shape and process (``Fitter``) and every dataset's
outcomes are swapped in with nutpie's ``with_data``: all datasets of a family and frame count
share the design, so one compilation per model serves every dataset. H5's model holds its
data as constants and compiles per dataset. Each reported contrast keeps its label,
HDI, R-hat, bulk/tail ESS and divergences; a fit that misses the registered convergence
rule is kept and flagged (``converged`` false), never dropped (D7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.controls import control_verdict
from fear_assets.core.sections import Convergence
from fear_assets.models.fits import contrast_summary, convergence_problems
from fear_assets.models.h5_model import H5Priors
from fear_assets.models.primary_model import Fitter, Priors, divergences, frame_form_of, sample
from fear_assets.simulation.accelerated import ADAPTIVE_ALGORITHMS, fit_block
from fear_assets.simulation.blocks import REPORTED, WITH_PRIMARY, check_blocks, dataset_seed, simulate_blocks
from fear_assets.simulation.design import SimulatedDesign
from fear_assets.simulation.generator import PRIMARY_MODEL_BLOCKS, PilotEstimates, scenario_size
from fear_assets.simulation.models import pilot_residual_sd, residual_sd_exists
from fear_assets.simulation.sampler_path import ACCELERATOR, NUTPIE_LOOP

__all__ = ["REPORTED", "WITH_PRIMARY", "LABEL_COLUMNS", "Rules", "dataset_seed", "truths", "not_simulated",
           "fit_dataset", "run_batch", "run_batch_accelerated", "accelerator_sampler"]

#: Stored per contrast; timings stay out so the same inputs give byte-identical batch files.
LABEL_COLUMNS = ["family", "scenario", "frames", "dataset", "contrast", "truth", "mean", "hdi_low", "hdi_high",
                 "label", "practically_meaningful", "control_passed", "rhat", "ess_bulk", "ess_tail", "divergences",
                 "converged", "convergence_problems", "frame_parametrisation", "sampler"]


def accelerator_sampler(algorithm: str) -> str:
    """The ``sampler`` of a row fitted on the accelerator path under ``algorithm``."""
    return f"{ACCELERATOR}:{algorithm}"


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


def truths(scenario: str, rules: Rules, est: PilotEstimates) -> dict[str, float]:
    """The true value of every reported contrast in a scenario (gate (c) on its standardised
    scale: the tested model's H2 minus the judge's zero, over the pilot residual SD)."""

    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    out = {"H1": size, "H2": size, "H3": size, "H4": size, "H5": size, "gate_a": size, "gate_b": size,
           "gate_c": size / pilot_residual_sd(est) if residual_sd_exists(est) else float("nan")}  # nan: not simulated
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
    if "judge" in blocks and not residual_sd_exists(est):
        out["gate_c"] = f"the pilot residual has no finite SD (nu {est.nu:.2f} <= 2): gate (c) has no scale (6.2)"
    for block in blocks:
        if block.startswith("control_") and block.removeprefix("control_") not in est.controls:
            out[block] = f"no pilot estimate of {block}"
    for block, contrasts in REPORTED.items():
        if block not in blocks:
            out.update({c: f"block {block} not in this run" for c in contrasts if c not in out})
    return out


def _label_row(family: str, scenario: str, frames: int, dataset: int, contrast: str, truth: float, draws: np.ndarray,
               chains: int, n_divergences: int, rules: Rules, rope: float | None = None,
               decision=None, frame_form: str | None = None, sampler: str = NUTPIE_LOOP) -> dict:
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
            "convergence_problems": "; ".join(problems), "frame_parametrisation": frame_form, "sampler": sampler}


def fit_dataset(fitter: Fitter, design: SimulatedDesign, est: PilotEstimates, rules: Rules, family: str,
                scenario: str, dataset: int, master_seed: int, blocks: Sequence[str] = tuple(PRIMARY_MODEL_BLOCKS)
                ) -> list[dict]:
    """Simulate and fit the blocks of one dataset (all of them unless ``blocks`` says
    otherwise; the controls 2-4 and gate (c) are joint fits with the primary block, so they
    need "primary"), each with its registered analysis model (``blocks.simulate_blocks`` draws
    them); one row per reported contrast. Blocks whose pilot estimates are missing
    (``not_simulated``) are skipped."""

    check_blocks(blocks)
    truth = truths(scenario, rules, est)
    n = design.n_frames
    seed_of = lambda block: dataset_seed(master_seed, family, scenario, n, dataset, "fit:" + block)  # noqa: E731
    rows: list[dict] = []
    # the controls' condition factor takes the fitter's fixed-effect prior sd; no other block reads it
    fixed_sd = fitter.priors.fixed_sd if any(b.startswith("control_") for b in blocks) else None
    simulated = simulate_blocks(design, est, rules, family, scenario, dataset, master_seed, blocks, fixed_sd,
                                not_simulated(est, blocks))
    for block, b in simulated.items():
        if b.kind == "h5":
            # The H5 model holds its data as constants (no data containers): compiled per dataset.
            idata = sample(b.build(fitter.priors, rules.h5_priors), fitter.draws, fitter.tune, fitter.chains,
                           seed_of(block))
        else:
            idata = fitter.fit(b.data, seed_of(block))
        chains = int(idata.posterior.sizes["chain"])
        form = frame_form_of(idata) if b.frame_form_reported else None
        for contrast, draws in b.contrasts(idata).items():
            rows.append(_label_row(family, scenario, n, dataset, contrast, truth[contrast], draws, chains,
                                   divergences(idata), rules, rope=b.rope, decision=b.decision, frame_form=form))
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


def run_batch_accelerated(design: SimulatedDesign, est: PilotEstimates, rules: Rules, priors: Priors, frame_rule,
                          sampler, max_extensions: int, family: str, scenario: str,
                          datasets: range, master_seed: int, log=lambda message: None,
                          blocks: Sequence[str] = tuple(PRIMARY_MODEL_BLOCKS)) -> tuple[pd.DataFrame, dict]:
    """One batch on the accelerator path (6.3): the same datasets ``run_batch`` fits (the same
    seeded outcomes), each block's datasets fitted together under the simulation sampler
    ``sampler`` (``accelerated.fit_block``: one compiled program per frame form, the registered
    ``frame_rule`` picking each dataset's form), labelled and judged by the same rules, one row
    per dataset and reported contrast in ``run_batch``'s order; and, per block, what its
    programs did (timings, extensions, step sizes). A frozen sampler (ChEES, NUTS) tunes on
    ``sampler.pilot_datasets`` datasets of the design drawn for tuning only (never scored)."""
    check_blocks(blocks)
    truth = truths(scenario, rules, est)
    n = design.n_frames
    skip = not_simulated(est, blocks)
    fixed_sd = priors.fixed_sd if any(b.startswith("control_") for b in blocks) else None
    # tuning datasets: ids below 0, which no batch scores
    tuning = range(-int(sampler.pilot_datasets), 0) if sampler.algorithm not in ADAPTIVE_ALGORITHMS else range(0)
    simulated = {i: simulate_blocks(design, est, rules, family, scenario, i, master_seed, blocks, fixed_sd, skip)
                 for i in (*tuning, *datasets)}
    label = accelerator_sampler(sampler.algorithm)
    present = list(simulated[datasets[0]]) if datasets else []  # simulate_blocks' order, as run_batch
    rows: dict[int, list[dict]] = {i: [] for i in datasets}
    programs = {}
    for block in present:
        fit = fit_block([simulated[i][block] for i in datasets], [simulated[i][block] for i in tuning], priors,
                        rules.h5_priors, frame_rule, sampler,
                        dataset_seed(master_seed, family, scenario, n, datasets[0], "accelerated:" + block),
                        rules.convergence, max_extensions, log=log)
        programs[block] = fit.programs
        for j, i in enumerate(datasets):
            b = simulated[i][block]
            form = fit.forms[j] if b.frame_form_reported else None
            n_div = int(np.sum(fit.divergences[j]))
            for contrast, draws in fit.contrasts.items():
                rows[i].append(_label_row(family, scenario, n, i, contrast, truth[contrast], draws[j].reshape(-1),
                                          int(draws[j].shape[0]), n_div, rules, rope=b.rope, decision=b.decision,
                                          frame_form=form, sampler=label))
    table = pd.DataFrame([r for i in datasets for r in rows[i]], columns=LABEL_COLUMNS)
    return table, programs
