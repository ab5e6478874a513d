"""The primary model over two blocks in one fit, with a two-level block factor (protocol
4.6, 4.8, 6.1-6.2; D3b, D4).

Two registered analyses compare a contrast between two blocks of trials on the same frames:
gate (c) compares the tested model's and the foreign judge's standardised H2 ("one joint
model with a reader factor and reader-specific variances"), and each positive control is
"fitted with the primary model on the control cells against the matched primary cells".
Both are this model:

  y ~ Student-t(nu, mu, sigma[block or shared]),
  mu = intercept + X beta                      (the primary model's fixed effects, shared)
       + f * [1, agent x content x depth cols] gamma   (the block factor, sum-coded f = +-1,
                                                        and its interactions)
       + frame effects (intercept, agent, content, agent x content: six correlated effects,
         LKJ(2), half-Normal(0, 0.5) scales; shared by both blocks, so the same frame's
         effects are paired across them)
       + f * block frame deviations (per frame, the block factor's agent x content
         slopes: two correlated effects, LKJ(2), half-Normal(0, 0.5) scales)
       + a unit intercept (a unit is one document of one block: the blocks' documents
         differ in their system prompt, so a unit does not span them).

The block frame deviations are the contrast's terms by frame, per block: gate (c)'s estimand
(tested-minus-judge H2) and the instructed-interaction control's (control-minus-primary
peer/person interaction) are both the block factor's agent x content interaction, and a frame
may carry that interaction more in one block than the other. Without them the shared frame
slopes pair the blocks' slopes exactly, any frame-to-frame variation of the difference goes
into the residual, and the contrast's HDI is too narrow (a gate can read Supported where it
is Unresolved). The first block's slopes (tested, control) = shared + deviation, the second's
(judge, primary) = shared - deviation (sum-coded f = +-1): the block factor's interaction
varies by frame, as the primary model's agent, content and agent x content vary by frame
("random slopes ... by frame", 6.1).
Prior of the added deviations, and why it is the registered one: 6.1 fixes
"half-Normal(0, 0.5) on every standard deviation, and an LKJ(2) prior on random-effect
correlations"; the deviations are random effects, so their two SDs are half-Normal(group_sd)
and their correlation LKJ(lkj_eta), read from the same ``Priors`` (the settings' priors
section) as the frame effects, non-centred like them. They form their own covariance block
(independent of the six shared effects): reading taken, since the registered structure has
no block factor to correlate with; it keeps the six shared effects' prior exactly the
primary model's.

The random effects and the Student-t residual come from ``primary_model``
(``frame_and_unit_effects``, ``student_t_residual``): one copy of the registered structure.
Priors: as the primary model; the block factor's coefficients Normal(0, ``factor_sd``)
(gate (c): the registered reader-factor prior; the controls: the fixed-effect prior, since
the condition factor is a fixed effect of the primary model's design). The residual scale is
per block where ``per_block_sigma`` (gate (c)'s reader-specific variances), else shared
(a control block is read by the same model as its primary cells).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.coding import cell_row, design, frame_slopes, sum_columns
from fear_assets.models.primary_model import (COVARIATES, FRAME_EFFECTS, PREDICTORS, DesignCells, Priors,
                                                check_band, check_choice, check_covariates, covariate_columns,
                                                design_cells, design_data,
                                                fixed_part, frame_and_unit_effects, hypotheses, posterior_draws,
                                                student_t_residual)

_CELL_FACTORS = ("agent", "content", "depth")
_COLUMNS = ("agent", "content", "depth", "order", "option", "rotation", "fear", "frame", "unit")


def deviation_columns(n_effects: int) -> tuple[int, ...]:
    """The frame-effect columns the block factor's frame deviations are on: the agent x
    content slopes (the terms of gate (c)'s and the instructed-interaction control's contrast)."""
    names = FRAME_EFFECTS.get(n_effects)
    if names is None:
        raise ValueError(f"the joint model reads the frame effects of two or three agents (4 or 6 columns); "
                         f"got {n_effects}")
    return tuple(j for j, n in enumerate(names) if ":" in n)


@dataclass
class JointData:
    """Model inputs of the two-block model (one row per trial)."""

    y: np.ndarray
    X: np.ndarray  # shared fixed effects (primary-model design, no intercept)
    names: list[str]
    W: np.ndarray  # block factor: block column x [1, agent x content x depth columns]
    w_names: list[str]
    cell_columns: np.ndarray  # indices of X's agent x content x depth columns
    Z: np.ndarray  # the six frame-effect columns (1, agent, content, agent x content)
    V: np.ndarray  # block frame deviations' columns: f x Z's agent x content columns
    block: np.ndarray  # 0 or 1 (index into ``blocks``)
    frame: np.ndarray
    unit: np.ndarray  # unit-by-block index
    n_frames: int
    n_units: int
    levels: Mapping[str, Sequence]
    blocks: tuple[str, str]
    factor: str  # "reader" or "condition"
    factor_sd: float
    per_block_sigma: bool
    covariates: tuple[str, ...] = field(default=COVARIATES)

    def model_functions(self):
        """(build, same_shape, data_updates), so ``primary_model.Fitter`` compiles it once per
        shape and refits other data of that shape through nutpie's ``with_data``."""
        return build_joint_model, joint_same_shape, joint_updates


def prepare_joint(data: pd.DataFrame, levels: Mapping[str, Sequence], factor: str, blocks: Sequence[str],
                  factor_sd: float, per_block_sigma: bool, outcome: str = "outcome",
                  covariates: Sequence[str] = COVARIATES,
                  scale: Mapping[str, float] | None = None) -> JointData:
    """``data``: the primary model's columns plus ``factor`` (one of ``blocks``), both blocks'
    trials stacked, covariates already centred (each block on its reader's bank means).
    ``scale`` divides each block's outcome by its own number (gate (c): each reader's pilot
    residual SD)."""
    blocks = tuple(blocks)
    if len(blocks) != 2:
        raise ValueError(f"the joint model compares exactly two blocks; got {list(blocks)}")
    missing = [c for c in (*_COLUMNS, factor, outcome) if c not in data.columns]
    if missing:
        raise ValueError(f"joint-model data lack column(s) {missing}: add them (the primary model's columns "
                         f"plus {factor!r})")
    unknown = sorted(set(map(str, data[factor])) - set(blocks))
    if unknown:
        raise ValueError(f"column {factor!r} has {unknown}, not among {list(blocks)}: relabel those rows")
    absent = [b for b in blocks if not (data[factor] == b).any()]
    if absent:
        raise ValueError(f"no rows for {factor} {absent}: the joint model needs both blocks' trials")
    if data[outcome].isna().any():
        raise ValueError(f"column {outcome!r} is missing in {int(data[outcome].isna().sum())} rows: drop or fill them")
    check_covariates(data, covariates, f"joint model ({factor})")
    y = data[outcome].to_numpy(float)
    if scale is not None:
        y = y / data[factor].map(dict(scale)).to_numpy(float)
    X, names = design(data, levels, covariates)
    cell_columns = np.array([i for i, n in enumerate(names) if n.split("[")[0] in _CELL_FACTORS], dtype=int)
    f = sum_columns(list(data[factor]), blocks)
    W = f * np.column_stack([np.ones(len(data)), X[:, cell_columns]])
    lead = f"{factor}[{blocks[0]}]"
    w_names = [lead] + [f"{lead}:{names[i]}" for i in cell_columns]
    block_idx = np.array([blocks.index(v) for v in data[factor]])
    _, frame_idx = np.unique(data["frame"], return_inverse=True)
    _, unit_idx = np.unique(data["unit"].astype(str) + "|" + data[factor].astype(str), return_inverse=True)
    Z = frame_slopes(data, levels)
    V = f * Z[:, list(deviation_columns(Z.shape[1]))]
    return JointData(y, X, names, W, w_names, cell_columns, Z, V, block_idx, frame_idx, unit_idx,
                     int(frame_idx.max()) + 1, int(unit_idx.max()) + 1, levels, blocks, factor,
                     float(factor_sd), bool(per_block_sigma), tuple(covariates))


def joint_design(d: JointData) -> tuple[np.ndarray, tuple[int, ...]]:
    """The joint model's fixed-effect design, the shared and block columns side by side
    ([X | W], coefficients [beta, block_beta]), and its continuous covariate columns."""
    return np.column_stack([d.X, d.W]), covariate_columns(d.names, d.covariates)


def joint_cells(d: JointData) -> DesignCells:
    """The cells of the joint design (``primary_model.design_cells`` of :func:`joint_design`)."""
    X, columns = joint_design(d)
    return design_cells(X, d.Z, d.frame, columns)


def deviation_data(V: np.ndarray, frame: np.ndarray, predictor: str) -> dict[str, np.ndarray]:
    """The block frame deviations' containers: V row by row ("direct", with the design's
    ``frame``), or its distinct rows and each trial's (frame, row) index ("cells")."""
    check_choice("predictor", predictor, PREDICTORS)
    if predictor == "direct":
        return {"V": V}
    patterns, pattern = np.unique(V, axis=0, return_inverse=True)
    return {"V_patterns": patterns,
            "v_pattern": frame.astype(np.int64) * len(patterns) + pattern.reshape(-1).astype(np.int64)}


def block_frame_deviations(data: Mapping, n_frames: int, n_effects: int, priors: Priors):
    """The block factor's frame deviations' contribution to mu, inside a model context:
    ``n_effects`` correlated effects per frame, LKJ(lkj_eta) correlations and
    half-Normal(group_sd) scales (6.1's priors on every random-effect SD and correlation),
    non-centred (``block_frame_chol``, ``z_block_frame``, ``block_frame_effects``)."""
    import pymc as pm

    chol, _, _ = pm.LKJCholeskyCov("block_frame_chol", n=n_effects, eta=priors.lkj_eta,
                                   sd_dist=pm.HalfNormal.dist(priors.group_sd), compute_corr=True)
    z = pm.Normal("z_block_frame", 0.0, 1.0, shape=(n_frames, n_effects))
    effects = pm.Deterministic("block_frame_effects", z @ chol.T)
    if "V" in data:
        return (data["V"] * effects[data["frame"]]).sum(axis=1)
    return pm.math.dot(effects, data["V_patterns"].T).reshape((-1,))[data["v_pattern"]]


def build_joint_model(d: JointData, priors: Priors, predictor: str = "cells"):
    """Named variables: ``intercept``, ``beta`` (shared), ``block_beta`` (the block factor),
    the primary model's ``frame_chol``/``z_frame``/``frame_effects`` and ``unit_sd``/``z_unit``,
    the block frame deviations ``block_frame_chol``/``z_block_frame``/``block_frame_effects``,
    ``sigma`` (dims block where per-block), ``nu``. Data are ``pm.Data`` containers.
    ``predictor``: mu per distinct design row ("cells") or row by row ("direct"), as in
    ``primary_model.build_model``; the same model."""
    import pymc as pm
    import pytensor.tensor as pt

    n_effects = d.Z.shape[1]
    coords = {"fixed": d.names, "block_fixed": d.w_names, "block": list(d.blocks),
              "frame_effect": FRAME_EFFECTS.get(n_effects, [f"e{i}" for i in range(n_effects)])}
    with pm.Model(coords=coords) as model:
        data = {k: pm.Data(k, v) for k, v in joint_updates(d, predictor).items()}
        intercept = pm.Normal("intercept", 0.0, priors.intercept_sd)
        fixed_sd = pm.Data("fixed_sd", np.asarray(priors.fixed_sd, dtype="float64"))
        beta = pm.Normal("beta", 0.0, fixed_sd, dims="fixed")
        block_beta = pm.Normal("block_beta", 0.0, d.factor_sd, dims="block_fixed")
        # the design is [X | W] (joint_design), so its coefficients are [beta, block_beta]
        fixed = fixed_part(data, intercept, pt.concatenate([beta, block_beta]),
                           covariate_columns(d.names, d.covariates))
        random = frame_and_unit_effects(data, d.n_frames, n_effects, d.n_units, priors)
        if d.V.shape[1]:
            random = random + block_frame_deviations(data, d.n_frames, d.V.shape[1], priors)
        sigma, nu = student_t_residual(priors, dims="block" if d.per_block_sigma else None)
        mu = fixed + random
        pm.StudentT("y_obs", nu=nu, mu=mu, sigma=sigma[data["block"]] if d.per_block_sigma else sigma,
                    observed=data["y"])
    return model


def joint_same_shape(a: JointData, b: JointData) -> bool:
    return (a.X.shape[1] == b.X.shape[1] and a.W.shape[1] == b.W.shape[1] and a.Z.shape[1] == b.Z.shape[1]
            and a.V.shape[1] == b.V.shape[1]
            and a.n_frames == b.n_frames and a.n_units == b.n_units and list(a.names) == list(b.names)
            and list(a.w_names) == list(b.w_names) and a.per_block_sigma == b.per_block_sigma
            and a.factor_sd == b.factor_sd and tuple(a.covariates) == tuple(b.covariates))


def joint_updates(d: JointData, predictor: str = "cells") -> dict[str, np.ndarray]:
    """The joint model's data containers for ``d`` (what ``with_data`` swaps per fit)."""
    X, columns = joint_design(d)
    out = design_data(X, d.Z, d.frame, columns, predictor)
    if d.V.shape[1]:
        out.update(deviation_data(d.V, d.frame, predictor))
    out.update({"y": d.y, "unit": d.unit.astype("int64")})
    if d.per_block_sigma:  # the block index enters the graph only through the per-block scales
        out["block"] = d.block.astype("int64")
    return out


def block_cell_means(idata, d: JointData, band: Sequence) -> dict[str, dict[tuple[str, str], np.ndarray]]:
    """Per block, mu(a, c): draws of each cell mean averaged with equal weight over the band
    depths and over the nuisance factors (their sum-coded columns at zero, as ``cell_row``
    does); every band depth must be in the data."""
    check_band(band, d.levels["depth"], f"joint model ({d.factor})")
    intercept, beta, block_beta = (posterior_draws(idata, n) for n in ("intercept", "beta", "block_beta"))
    out = {}
    for block in d.blocks:
        f = sum_columns([block], d.blocks)[0, 0]
        mu = {}
        for agent in d.levels["agent"]:
            for content in d.levels["content"]:
                row = np.mean([cell_row(agent, content, depth, d.levels, len(d.covariates)) for depth in band], axis=0)
                w = f * np.concatenate([[1.0], row[d.cell_columns]])
                mu[(agent, content)] = intercept + beta @ row + block_beta @ w
        out[block] = mu
    return out


def block_hypotheses(idata, d: JointData, band: Sequence) -> dict[str, dict[str, np.ndarray]]:
    """D3's H1-H3 in each block, from :func:`block_cell_means`."""
    return {block: hypotheses(mu) for block, mu in block_cell_means(idata, d, band).items()}
