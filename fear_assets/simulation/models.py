"""Datasets from the analysis models that are not the primary model on one block, and their
registered fits (protocol 6.3: "each fitted under exactly the registered priors by every
analysis model that the reading needs"; D7).

Each generator draws one block's outcomes on the fixed registered design from the model that
analyses it, at the pilot estimates (random-slope SDs x the registered inflation), with the
effect of interest set by the scenario; each fit calls the analysis code's own model builder
and contrast (no second copy of any model):

- positive controls 2-4 (4.6, D4): the control block and the matched primary cells share one
  dataset's frame effects, the control block adding its own per-frame deviations of the
  agent x content slopes (the joint two-block model's structure, ``analysis.joint``:
  ``generator.with_block_deviations`` at ``generator.block_deviation_covariance``); fitted
  with ``analysis.controls.fit_control`` (one joint fit, condition factor). Each control's
  contrast is at its pilot estimate.
- control 1, the addressee's name: its own cells (registered cell set ``control_addressee``),
  no surprisal covariates, the addressee contrast at its pilot estimate; ``fit_control``.
- gate (c) (6.2): the judge block shares the tested block's frame effects on the standardised
  scale plus its own per-frame deviations of the agent x content slopes (as the controls); the
  tested model's H2 is the scenario's size and the judge's is zero, so the gate's
  standardised difference is size / sigma (the meaningful size 0.30/sigma at "meaningful",
  zero at "null"); fitted by ``gate_c.prepare_gate_c`` + the joint model, labelled by
  ``gate_c_decision`` (ROPE sesoi / sigma). The judge's raw outcome is on the judge's pilot
  residual SD (``PilotEstimates.judge_sigma``, ``pilot_scales.pilot_judge_sigma``; the tested
  model's where the pilot scored no judge block). The judge's covariates are the tested design's
  (its own surprisals do not exist for frames not yet written).
- H4 (6.1): the primary model on probe log-odds, both content versions of each document as
  two rows with an option term and a document intercept (``prepare(..., document=...)``), at
  the pilot's H4 estimates; H4 is H2 on that scale.
- H5 (6.1): the hierarchical probit at the H5 depth (``h5_model.build_h5_model``): forced
  choices of the six cells plus the content-removed trials (criterion only), d' of every cell
  at the pilot's mean d' with d'(self, threat) - d'(self, harmless) = the scenario's size,
  per-frame d' deviations with the pilot SDs x the inflation and the pilot's correlations, and
  a criterion with the pilot's position and cell effects (the pilot fit itself reads the
  pilot's content-removed trials, which are what inform the criterion). The H5 model has no data
  containers, so it compiles per dataset (said in the benchmark).

A block whose pilot estimates are absent (``PilotEstimates.h4``/``h5`` None) is not simulated
and its targets say so (never met).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.controls import addressee_contrast
from fear_assets.analysis.h4 import h4_model_data
from fear_assets.models.data import AGENTS, CONTENTS, kept
from fear_assets.models.h5_model import build_h5_model, prepare_h5
from fear_assets.models.joint import deviation_columns
from fear_assets.models.primary_model import PrimaryData, build_model, cell_means, posterior_draws, prepare, sample
from fear_assets.simulation.design import AddresseeDesign, SimulatedDesign
from fear_assets.simulation.generator import (
    PilotEstimates,
    agent_effects,
    block_deviation_covariance,
    draw_frame_effects,
    pilot_estimates,
    simulate_block,
    true_beta,
    with_block_deviations,
)


def own_frames(est: PilotEstimates, frames: np.ndarray, inflation: float, rng: np.random.Generator,
               deviation_cov: np.ndarray | None = None) -> np.ndarray:
    """A second block's frame effects: the primary block's ``frames`` plus its own deviations of
    the joint model's contrast terms (``joint.deviation_columns``), at ``deviation_cov`` (default:
    ``block_deviation_covariance``, the pilot's, inflated)."""

    columns = deviation_columns(frames.shape[1])
    cov = block_deviation_covariance(est, inflation, columns) if deviation_cov is None else deviation_cov
    return with_block_deviations(frames, columns, cov, rng)


@dataclass(frozen=True)
class H5Estimates:
    """Posterior means of a pilot H5 fit (the probit's parameters), every one of them the
    pilot's (6.3: "all fixed effects and variance components at their pilot estimates")."""

    criterion_intercept: float
    position: float  # criterion effect of option 1 listed first (sum-coded column)
    criterion_frame_sd: float
    dprime: float  # mean d' over the cells: every cell's value before the scenario's H5
    dprime_frame_sd: tuple[float, ...]  # per cell, before inflation
    #: The criterion's sum-coded cell effects (``prepare_h5``'s cell columns, the last cell
    #: implied). Empty: an estimate stored before they were recorded, read as zero effects.
    criterion_cells: tuple[float, ...] = ()
    #: Correlations of the per-frame d' deviations across cells (the fit's LKJ correlations).
    #: Empty: an estimate stored before they were recorded, read as independent deviations.
    dprime_frame_corr: tuple[tuple[float, ...], ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping) -> "H5Estimates":
        return cls(float(d["criterion_intercept"]), float(d["position"]), float(d["criterion_frame_sd"]),
                   float(d["dprime"]), tuple(float(x) for x in d["dprime_frame_sd"]),
                   tuple(float(x) for x in d.get("criterion_cells", ())),
                   tuple(tuple(float(x) for x in r) for r in d.get("dprime_frame_corr", ())))

    def as_dict(self) -> dict:
        out = {"criterion_intercept": self.criterion_intercept, "position": self.position,
               "criterion_frame_sd": self.criterion_frame_sd, "dprime": self.dprime,
               "dprime_frame_sd": list(self.dprime_frame_sd)}
        if self.criterion_cells:  # absent keys keep earlier stored estimates byte-identical
            out["criterion_cells"] = list(self.criterion_cells)
        if self.dprime_frame_corr:
            out["dprime_frame_corr"] = [list(r) for r in self.dprime_frame_corr]
        return out


def h5_estimates(idata) -> H5Estimates:
    """Pilot estimates from a fit of ``build_h5_model`` (posterior means): the criterion's
    intercept, position and cell effects, its frame SD, the mean d', and the per-frame d'
    deviations' SDs and correlations."""
    post = idata.posterior
    mean = lambda name: np.asarray(post[name].mean(dim=("chain", "draw")).values)  # noqa: E731
    beta = mean("criterion_beta")
    return H5Estimates(float(mean("criterion_intercept")), float(beta[0]),
                       float(mean("criterion_frame_sd")), float(mean("dprime").mean()),
                       tuple(float(x) for x in mean("dprime_frame_chol_stds")),
                       tuple(float(x) for x in beta[1:]),
                       tuple(tuple(float(x) for x in r) for r in mean("dprime_frame_chol_corr")))


def h5_frame_deviations(h5: H5Estimates, n_cells: int, n_frames: int, inflation: float,
                        rng: np.random.Generator) -> np.ndarray:
    """Per-frame d' deviations (frames x cells) at the pilot's SDs x ``inflation`` and the
    pilot's correlations across cells (independent where the estimate predates them)."""
    sd = np.resize(np.asarray(h5.dprime_frame_sd, dtype=float), n_cells) * inflation
    corr = np.asarray(h5.dprime_frame_corr, dtype=float) if h5.dprime_frame_corr else np.eye(n_cells)
    if corr.shape != (n_cells, n_cells):
        raise ValueError(f"the pilot's d' frame correlations are {corr.shape}, the design has {n_cells} cells: "
                         "re-materialise power_pilot_estimates")
    # Correlated standard normals scaled by the SDs (an SD may be zero, a correlation matrix never singular).
    return (rng.standard_normal((n_frames, n_cells)) @ np.linalg.cholesky(corr).T) * sd


def residual_sd_exists(est: PilotEstimates) -> bool:
    """Whether the Student-t residual at the pilot estimates has a finite SD (nu > 2)."""
    return est.nu > 2


def pilot_residual_sd(est: PilotEstimates) -> float:
    """The Student-t residual SD at the pilot estimates, sigma * sqrt(nu / (nu - 2)): gate (c)'s
    sigma (6.2; ``primary_model.implied_residual_sd`` reads it from a posterior)."""
    if not residual_sd_exists(est):
        raise ValueError(f"pilot nu {est.nu} <= 2: the Student-t residual has no finite SD, gate (c) has no scale")
    return float(est.sigma * np.sqrt(est.nu / (est.nu - 2.0)))


# --- tables: the design with outcomes, as the analysis code reads them ----------------------
def with_outcome(design: SimulatedDesign, d: PrimaryData) -> pd.DataFrame:
    """The design's model table with a block's simulated outcome (``outcome`` and ``delta``)."""
    return design.table.assign(outcome=d.y, delta=d.y)


def control_tables(design: SimulatedDesign, est: PilotEstimates, primary: PrimaryData, frames: np.ndarray,
                   size_effects: Mapping[str, float], shift: float, inflation: float, rng: np.random.Generator,
                   deviation_cov: np.ndarray | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(control block, primary block) of controls 2-4: the control block drawn with the
    primary block's frame effects plus its own agent x content deviations (``own_frames``),
    as the joint model has them."""
    control = simulate_block(design.data, est, true_beta(est, design.data, design.band, size_effects), shift,
                             inflation, rng, frames=own_frames(est, frames, inflation, rng, deviation_cov))
    return with_outcome(design, control), with_outcome(design, primary)


def addressee_table(ad: AddresseeDesign, est: PilotEstimates, contrast: float, inflation: float,
                    rng: np.random.Generator) -> pd.DataFrame:
    """Outcomes of the addressee block: the pilot intercept and variance components (the four
    frame effects its two agents have), the agent main effect solved from
    ``controls.addressee_contrast`` itself so the contrast is ``contrast`` at every depth, other
    fixed effects zero (the pilot's are for the primary agents)."""
    d = ad.data
    p = len(d.names)
    mu = cell_means(d, np.eye(p), np.zeros(p), list(ad.band))
    w = addressee_contrast(mu)
    # Only the agent main effect carries it, so the contrast is the same at every depth.
    free = [i for i, n in enumerate(d.names) if n.startswith("agent[") and ":" not in n]
    beta = np.zeros(p)
    beta[free] = w[free] * contrast / float(w[free] @ w[free])
    sim = simulate_block(d, est, beta, 0.0, inflation, rng)
    return ad.table.assign(outcome=sim.y, delta=sim.y)


def judge_table(design: SimulatedDesign, est: PilotEstimates, frames: np.ndarray, judge_sigma: float,
                inflation: float, rng: np.random.Generator, deviation_cov: np.ndarray | None = None) -> pd.DataFrame:
    """The judge block of gate (c): H2 = 0 at every scenario, the tested block's frame effects
    plus its own agent x content deviations (``own_frames``; same standardised scale), its raw
    outcome on the judge's own scale (x judge_sigma / tested sigma), so that ``prepare_gate_c``'s
    standardisation returns the joint model's structure."""
    beta = true_beta(est, design.data, design.band, agent_effects(0.0))
    sim = simulate_block(design.data, est, beta, 0.0, inflation, rng,
                         frames=own_frames(est, frames, inflation, rng, deviation_cov))
    y = sim.y * judge_sigma / pilot_residual_sd(est)
    return design.table.assign(outcome=y, delta=y)


def h4_design(design: SimulatedDesign) -> tuple[pd.DataFrame, PrimaryData]:
    """H4's model table: both content versions of each primary document (option shown and the
    other option) as two rows sharing a document; log-odds filled in by ``h4_table``."""
    shown = design.table.assign(version="shown")
    other = design.table.assign(option=3 - design.table["option"], version="other")
    table = pd.concat([shown, other], ignore_index=True)
    table["document"] = table["unit"] + "|" + table["agent"] + "|" + table["content"]
    d = prepare(table.assign(log_odds=0.0), design.data.levels, outcome="log_odds", document="document")
    return table, d


def h4_table(table: pd.DataFrame, d: PrimaryData, est: PilotEstimates, band: Sequence[str], size: float,
             inflation: float, rng: np.random.Generator) -> pd.DataFrame:
    """Probe log-odds from the primary model with a document intercept, at the pilot's H4
    estimates (``est.h4``), H1 = H2 = H3 = ``size`` on the log-odds scale."""
    h4 = PilotEstimates.from_dict(est.h4)
    beta = true_beta(h4, d, band, agent_effects(size))
    sim = simulate_block(d, h4, beta, 0.0, inflation, rng)
    y = sim.y + float(est.h4["document_sd"]) * rng.normal(size=d.n_documents)[d.document]
    return table.assign(log_odds=y)


def h5_rows(design: SimulatedDesign, h5_depth: str) -> pd.DataFrame:
    """H5's trials: forced choices of the six cells at the H5 depth (option shown by the design's
    option rule) and the same documents' content-removed trials (shown_option 0)."""
    at = design.table[design.table["depth"] == h5_depth]
    if at.empty:
        raise ValueError(f"H5 depth {h5_depth!r} is not among the design's depths "
                         f"{sorted(design.table['depth'].unique())}: pass the registered H5 depth")
    rows = pd.concat([at.assign(shown_option=at["option"].astype(int)), at.assign(shown_option=0)],
                     ignore_index=True)
    return rows.assign(option1_first=rows["fc_first_listed"].astype(int) == 1, chose_option1=False)


def h5_table(rows: pd.DataFrame, cells: Sequence[tuple[str, str]], h5: H5Estimates, size: float,
             inflation: float, rng: np.random.Generator) -> pd.DataFrame:
    """Choices from the registered probit: eta = criterion + 0.5 * d' * s (``h5_model``), with
    d'(self, threat) - d'(self, harmless) = ``size``, per-frame d' deviations at the pilot's
    SDs x ``inflation`` and correlations (:func:`h5_frame_deviations`), and a criterion with
    the pilot's position and cell effects and frame intercepts."""
    from scipy.special import ndtr


    d = prepare_h5(rows, cells)
    dprime = np.full(len(cells), h5.dprime)
    dprime[list(cells).index(("self", "threat"))] += size / 2
    dprime[list(cells).index(("self", "harmless"))] -= size / 2
    dp_frame = h5_frame_deviations(h5, len(cells), d.n_frames, inflation, rng)
    crit_frame = rng.normal(size=d.n_frames) * h5.criterion_frame_sd
    beta = np.zeros(d.X.shape[1])
    beta[0] = h5.position
    if h5.criterion_cells:
        if len(h5.criterion_cells) != d.X.shape[1] - 1:
            raise ValueError(f"the pilot has {len(h5.criterion_cells)} criterion cell effects, the design "
                             f"{d.X.shape[1] - 1}: re-materialise power_pilot_estimates")
        beta[1:] = h5.criterion_cells
    criterion = h5.criterion_intercept + d.X @ beta + crit_frame[d.frame]
    eta = criterion + 0.5 * (dprime[d.cell] + dp_frame[d.frame, d.cell]) * d.s
    return rows.assign(chose_option1=rng.random(len(rows)) < ndtr(eta))


def shared_primary(design: SimulatedDesign, est: PilotEstimates, beta: np.ndarray, inflation: float,
                   rng: np.random.Generator) -> tuple[PrimaryData, np.ndarray]:
    """The primary block and its frame effects (kept for the blocks that share them); the same
    draws, in the same order, as ``simulate_block`` makes on its own."""
    frames = draw_frame_effects(est, inflation, design.data.n_frames, rng, design.data.Z.shape[1])
    return simulate_block(design.data, est, beta, 0.0, inflation, rng, frames=frames), frames


__all__ = ["H5Estimates", "h5_estimates", "pilot_residual_sd", "control_tables",
           "addressee_table", "judge_table", "h4_design", "h4_table", "h5_rows", "h5_table", "h5_frame_deviations",
           "shared_primary", "own_frames"]


def h5_pilot_rows(pilot_primary: pd.DataFrame, h5_depth: str,
                  content_removed: pd.DataFrame | None = None) -> pd.DataFrame:
    """The pilot's forced choices at the H5 depth as ``prepare_h5`` reads them, the same rows
    ``analysis.confirmatory.h5`` takes (4.8's exclusions out, choices 1 or 2): the primary
    trials, and the pilot's content-removed baseline trials (``shown_option`` 0), which
    inform only the criterion (4.5, 6.1). ``pilot_primary`` / ``content_removed``: the
    unmasked pilot scores of those blocks (agent, content, depth, fc_choice, content_option,
    fc_first_listed, item_id); a design that scores no content-removed block passes None."""

    def at_depth(scores: pd.DataFrame) -> pd.DataFrame:
        fc = kept(scores)
        return fc[(fc["depth"] == h5_depth) & fc["fc_choice"].astype(int).isin([1, 2])]

    fc = at_depth(pilot_primary)
    if fc.empty:
        raise ValueError(f"no pilot forced choices at the H5 depth {h5_depth!r}: score the pilot at that depth")
    parts = [fc.assign(shown_option=fc["content_option"].astype(int))]
    if content_removed is not None and len(content_removed):
        removed = at_depth(content_removed)
        parts.append(removed.assign(shown_option=0))
    rows = pd.concat(parts, ignore_index=True)
    return rows.assign(chose_option1=rows["fc_choice"].astype(int) == 1,
                       option1_first=rows["fc_first_listed"].astype(int) == 1, frame=rows["item_id"])


def h5_pilot_estimates(rows: pd.DataFrame, priors, draws: int, tune: int, chains: int, seed: int) -> H5Estimates:
    """6.3's pilot estimates of H5's probit: the registered model (``build_h5_model``) fitted to
    the pilot's forced choices, posterior means."""

    cells = [(a, c) for a in AGENTS for c in CONTENTS]
    idata = sample(build_h5_model(prepare_h5(rows, cells), priors), draws, tune, chains, seed)
    return h5_estimates(idata)


def h4_pilot_fit(data: pd.DataFrame, fears: Sequence[str], priors, draws: int, tune: int, chains: int,
                 seed: int) -> dict:
    """6.3's pilot estimates of H4's model from the pilot's probe outputs (``analysis.h4.h4_data``
    of the unmasked pilot probe): the registered H4 model (the primary model on probe log-odds
    with a document intercept, as ``analysis.h4.fit_h4`` builds it) fitted, posterior means."""

    d = h4_model_data(data, fears)
    return h4_pilot_estimates(sample(build_model(d, priors), draws, tune, chains, seed), d)


def h4_pilot_estimates(idata, d: PrimaryData) -> dict:
    """6.3's pilot estimates of H4's model (``PilotEstimates.h4``): posterior means of the
    pilot's H4 fit (the primary model on probe log-odds, ``prepare(..., document=...)``) plus
    its document-intercept SD."""

    if d.document is None:
        raise ValueError("H4's pilot fit has no document index: prepare it with document='document'")
    est = pilot_estimates(idata, d, {})
    return {**est.as_dict(), "document_sd": float(posterior_draws(idata, "document_sd").mean())}
