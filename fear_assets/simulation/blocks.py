"""The blocks of one simulated dataset as their registered analysis models read them (6.3).

One copy of "what is fitted": ``simulate_blocks`` draws every block of a dataset (seeded from
the registered master seed and the dataset's path) and returns, per block, the analysis
model's prepared data (``PrimaryData``, ``JointData`` or ``H5Data``), how its registered model
is built from them, and how its reported contrasts are read from a posterior. The nutpie loop
(``runner.fit_dataset``) and the accelerator path (``vectorised``: the model's log density from
PyMC's own graph with the outcome as an input) both fit exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis import gate_c as gc
from fear_assets.analysis.controls import control_contrast, control_data
from fear_assets.core.hashing import sampler_seed
from fear_assets.models.data import AGENTS, CONTENTS, levels_of
from fear_assets.models.h5_model import build_h5_model, h5_contrast, prepare_h5
from fear_assets.models.joint import build_joint_model
from fear_assets.models.parametrisation import frame_parametrisation
from fear_assets.models.primary_model import BUILDERS, cell_means, hypotheses, posterior_draws
from fear_assets.simulation import models
from fear_assets.simulation.design import SimulatedDesign
from fear_assets.simulation.generator import (PRIMARY_MODEL_BLOCKS, PilotEstimates, block_effects, gate_b_estimates,
                                              scenario_size, simulate_block, true_beta)

#: Contrasts reported from each block.
REPORTED = {"primary": ("H1", "H2", "H3"), "recall": ("gate_b",), "service_relevance": ("gate_a",),
            "control_instructed_interaction": ("control_instructed_interaction",),
            "control_instructed_priority": ("control_instructed_priority",),
            "control_marked_priority": ("control_marked_priority",),
            "control_addressee_name": ("control_addressee_name",), "judge": ("gate_c",), "probe": ("H4",),
            "forced_choice": ("H5",)}
#: Blocks fitted jointly with the primary block's cells (and sharing its frame effects).
WITH_PRIMARY = ("control_instructed_interaction", "control_instructed_priority", "control_marked_priority", "judge")
#: H5's cells, as ``analysis.confirmatory.h5`` orders them.
H5_CELLS = tuple((a, c) for a in AGENTS for c in CONTENTS)


def dataset_seed(master_seed: int, family: str, scenario: str, frames: int, dataset: int, purpose: str) -> int:
    """Every draw of the simulation derives from the registered master seed and its path."""
    return sampler_seed(master_seed, "power", family, scenario, frames, dataset, purpose)


@dataclass(frozen=True)
class BlockData:
    """One block of one dataset as its registered model reads it. ``kind``: "primary" (the
    primary model: gates (a), (b), H4, the addressee control), "joint" (the two-block model:
    controls 2-4, gate (c)) or "h5" (the probit). ``contrasts(idata)``: the reported contrast
    draws from a posterior of this block's fit. ``frame_form_reported``: whether the label row
    records the primary model's frame parametrisation."""

    block: str
    kind: str
    data: object
    contrasts: Callable[[object], dict[str, np.ndarray]]
    rope: float | None = None
    decision: Callable | None = None
    frame_form_reported: bool = False

    def build(self, priors, h5_priors, rule=None, predictor: str = "cells", form: str | None = None):
        """The registered PyMC model of this block's data: the primary model in the form the
        registered rule picks for these data (``rule`` None: non-centred; ``form``: this form
        instead, for a fit the rule's form left divergent), the joint model, or H5's probit
        (``h5_priors``); what ``primary_model.Fitter`` and ``sample`` fit."""
        if form is not None and self.kind != "primary":
            raise ValueError(f"block {self.block}: a frame form ({form!r}) is chosen only for the primary model; "
                             f"the {self.kind} model's form is fixed (pass form=None)")
        if self.kind == "h5":
            return build_h5_model(self.data, h5_priors)
        if self.kind == "joint":
            return build_joint_model(self.data, priors, predictor)
        if form is None:
            form = "non_centred" if rule is None else frame_parametrisation(self.data, rule)
        return BUILDERS[(form, predictor)](self.data, priors)


def check_blocks(blocks: Sequence[str]) -> None:
    unknown = [b for b in blocks if b not in PRIMARY_MODEL_BLOCKS]
    if unknown:
        raise ValueError(f"unknown simulated block(s) {unknown}: use those of {', '.join(PRIMARY_MODEL_BLOCKS)}")
    if any(b in WITH_PRIMARY for b in blocks) and "primary" not in blocks:
        raise ValueError(f"blocks {list(blocks)}: the controls 2-4 and gate (c) are joint fits with the primary "
                         f"block; include 'primary'")


def _hypotheses(d, band: Sequence[str]) -> Callable[[object], dict[str, np.ndarray]]:
    return lambda idata: hypotheses(cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"),
                                               band))


def simulate_blocks(design: SimulatedDesign, est: PilotEstimates, rules, family: str, scenario: str, dataset: int,
                    master_seed: int, blocks: Sequence[str], fixed_sd: float | None, skip: Mapping[str, str] = ()
                    ) -> dict[str, BlockData]:
    """Every block of ``blocks`` of one dataset (in ``PRIMARY_MODEL_BLOCKS`` order; a block whose
    contrast is in ``skip`` is left out), each drawn from its own seeded generator. ``rules``:
    ``runner.Rules``; ``fixed_sd``: the registered fixed-effect prior sd (the controls'
    condition factor's). Pure: the same inputs give the same data."""
    check_blocks(blocks)
    if fixed_sd is None and any(b.startswith("control_") for b in blocks):
        raise ValueError("the controls' blocks need the registered fixed-effect prior sd: pass fixed_sd")
    size = scenario_size(scenario, {"meaningful": rules.meaningful, "sesoi": rules.sesoi})
    d0, band, n = design.data, list(design.band), design.n_frames
    fears = list(d0.levels["fear"])
    out: dict[str, BlockData] = {}
    rng_of = lambda block: np.random.default_rng(dataset_seed(master_seed, family, scenario, n, dataset, block))  # noqa: E731
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
                read = _hypotheses(d, band)
            else:
                d = simulate_block(d0, gen, beta, 0.0, rules.inflation, rng)
                read = (lambda h, c: lambda idata: {c: h(idata)["H2"]})(_hypotheses(d, band), REPORTED[block][0])
            out[block] = BlockData(block, "primary", d, read, frame_form_reported=True)
        elif block in ("control_instructed_interaction", "control_instructed_priority", "control_marked_priority"):
            effects, shift = block_effects(block, size, est.controls)
            control, matched = models.control_tables(design, est, primary, frames, effects, shift, rules.inflation,
                                                     rng)
            name = block.removeprefix("control_")
            d = control_data(name, control, matched, fears, fixed_sd)
            out[block] = BlockData(block, "joint", d, (lambda nm, dd, b: lambda idata: {
                b: control_contrast(nm, idata, dd, band)})(name, d, block))
        elif block == "control_addressee_name":
            table = models.addressee_table(design.addressee, est, est.controls["addressee_name"], rules.inflation, rng)
            d = control_data("addressee_name", table, table, fears, fixed_sd)
            out[block] = BlockData(block, "primary", d, (lambda dd, b: lambda idata: {
                b: control_contrast("addressee_name", idata, dd, band)})(d, block))
        elif block == "judge":
            sigma_t = models.pilot_residual_sd(est)
            sigma_j = sigma_t if est.judge_sigma is None else float(est.judge_sigma)
            judge = models.judge_table(design, est, frames, sigma_j, rules.inflation, rng)
            data = pd.concat([models.with_outcome(design, primary).assign(reader="tested"),
                              judge.assign(reader="judge")], ignore_index=True)
            d = gc.prepare_gate_c(data, levels_of(data, fears), {"tested": sigma_t, "judge": sigma_j},
                                  rules.reader_factor_sd, outcome="outcome")
            rope, _ = gc.gate_c_bounds(sigma_t, rules.sesoi, rules.meaningful)

            def decide_c(low, high, sigma_t=sigma_t):
                dec = gc.gate_c_decision(low, high, sigma_t, rules.sesoi, rules.meaningful)
                return dec.label, dec.practically_meaningful

            # build_gate_c_model = the joint model at these priors (reader-factor sd in the data)
            out[block] = BlockData(block, "joint", d, (lambda dd: lambda idata: {
                "gate_c": gc.gate_c_contrast(idata, dd, band)})(d), rope=rope, decision=decide_c)
        elif block == "probe":
            table, d4 = models.h4_design(design)
            table = models.h4_table(table, d4, est, band, size, rules.inflation, rng)
            d = replace(d4, y=table["log_odds"].to_numpy(float))
            out[block] = BlockData(block, "primary", d, (lambda h: lambda idata: {"H4": h(idata)["H2"]})(
                _hypotheses(d, band)), frame_form_reported=True)
        elif block == "forced_choice":
            rows_h5 = models.h5_table(models.h5_rows(design, design.h5_depth), H5_CELLS,
                                      models.H5Estimates.from_dict(est.h5), size, rules.inflation, rng)
            d = prepare_h5(rows_h5, H5_CELLS)
            out[block] = BlockData(block, "h5", d, lambda idata: {"H5": h5_contrast(idata, H5_CELLS)})
    return out


def outcome(b: BlockData) -> np.ndarray:
    """The block's outcome vector as the model observes it (floats; H5's choices as 0/1)."""
    return np.asarray(b.data.y, dtype=float)


__all__ = ["REPORTED", "WITH_PRIMARY", "H5_CELLS", "BlockData", "dataset_seed", "simulate_blocks", "check_blocks",
           "outcome"]
