"""Gate (c), the foreign judge (protocol 4.8, 6.2): one joint model of two readers.

Each reader's Delta is standardised by that reader's own pilot trial-level residual SD
(y = Delta / sigma_reader), so both contrasts and the ROPE share one fixed scale. The model
is the primary model's fixed effects shared across readers, plus a sum-coded reader factor
interacted with agent x content x depth (the "reader factor", Normal(0, reader_factor_sd)),
a frame random intercept, a unit-by-reader random intercept (both half-Normal(0, group_sd)
scales, non-centred), reader-specific residual scales (half-Normal(0, residual_sd)) and a
Student-t likelihood with nu ~ Gamma as in the primary model. The gate's estimand is the
standardised H2 of the tested model minus that of the judge, averaged over the band depths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.coding import cell_row, design, sum_columns
from fear_assets.analysis.primary_model import COVARIATES, Priors, hypotheses

READERS = ("tested", "judge")
_CELL_FACTORS = ("agent", "content", "depth")
_COLUMNS = ("agent", "content", "depth", "order", "option", "rotation", "fear", "frame", "unit", "reader")


@dataclass(frozen=True)
class GateCPriors:
    """The primary model's priors plus the reader factor's Normal(0, reader_factor_sd)."""

    base: Priors
    reader_factor_sd: float

    @classmethod
    def from_settings(cls, settings) -> "GateCPriors":
        return cls(Priors.from_settings(settings), float(settings.section("priors")["gate_c_reader_factor_sd"]))


@dataclass
class GateCData:
    """Model inputs of the joint two-reader model (one row per trial and reader)."""

    y: np.ndarray  # Delta / sigma_reader
    X: np.ndarray  # shared fixed effects (primary-model design, no intercept)
    names: list[str]
    W: np.ndarray  # reader factor: reader column x [1, agent x content x depth columns]
    w_names: list[str]
    cell_columns: np.ndarray  # indices of X's agent x content x depth columns
    reader: np.ndarray
    frame: np.ndarray
    unit: np.ndarray  # unit-by-reader index
    n_frames: int
    n_units: int
    levels: Mapping[str, Sequence]
    sigmas: Mapping[str, float]
    readers: tuple[str, ...] = READERS
    covariates: tuple[str, ...] = field(default=COVARIATES)


def gate_c_bounds(sigma_pilot: float, sesoi: float, meaningful: float) -> tuple[float, float]:
    """(ROPE half-width, meaningful size) on the standardised scale: sesoi/sigma and
    meaningful/sigma (6.2), sigma being the pilot's primary-model trial-level residual SD,
    the only value inserted at registration."""
    if not (isinstance(sigma_pilot, (int, float)) and math.isfinite(sigma_pilot) and sigma_pilot > 0):
        raise ValueError(f"sigma_pilot must be a positive, finite residual SD; got {sigma_pilot!r}: "
                         f"insert the pilot primary model's trial-level residual SD")
    return sesoi / sigma_pilot, meaningful / sigma_pilot


def _reader_sigmas(sigmas: Mapping[str, float], readers: Sequence[str]) -> dict[str, float]:
    out = {}
    for reader in readers:
        value = sigmas.get(reader)
        if value is None or not math.isfinite(float(value)) or float(value) <= 0:
            raise ValueError(f"sigmas[{reader!r}] is {value!r}: pass each reader's pilot trial-level residual SD "
                             f"(a positive number) for readers {list(readers)}")
        out[reader] = float(value)
    return out


def prepare_gate_c(data: pd.DataFrame, levels: Mapping[str, Sequence], sigmas: Mapping[str, float],
                   outcome: str = "delta", covariates: Sequence[str] = COVARIATES,
                   readers: Sequence[str] = READERS) -> GateCData:
    """``data``: the primary model's columns plus ``reader`` (one of ``readers``), both
    readers' trials stacked. Covariates are centred within reader, because each reader's
    surprisals are on its own tokenizer's scale."""
    readers = tuple(readers)
    missing = [c for c in (*_COLUMNS, outcome, *covariates) if c not in data.columns]
    if missing:
        raise ValueError(f"gate (c) data lacks column(s) {missing}: add them (the primary model's columns "
                         f"plus 'reader')")
    unknown = sorted(set(map(str, data["reader"])) - set(readers))
    if unknown:
        raise ValueError(f"column 'reader' has {unknown}, not among {list(readers)}: relabel those rows")
    absent = [r for r in readers if not (data["reader"] == r).any()]
    if absent:
        raise ValueError(f"no rows for reader(s) {absent}: the gate needs both readers' trials")
    sig = _reader_sigmas(sigmas, readers)
    if data[outcome].isna().any():
        raise ValueError(f"column {outcome!r} is missing in {int(data[outcome].isna().sum())} rows: drop or fill them")
    data = data.copy()
    for cov in covariates:
        data[cov] = data[cov] - data.groupby("reader")[cov].transform("mean")
    y = data[outcome].to_numpy(float) / data["reader"].map(sig).to_numpy(float)
    X, names = design(data, levels, covariates)
    cell_columns = np.array([i for i, n in enumerate(names) if n.split("[")[0] in _CELL_FACTORS], dtype=int)
    r = sum_columns(list(data["reader"]), readers)
    if r.shape[1] != 1:
        raise ValueError(f"gate (c) compares exactly two readers; got {list(readers)}")
    W = r * np.column_stack([np.ones(len(data)), X[:, cell_columns]])
    lead = f"reader[{readers[0]}]"
    w_names = [lead] + [f"{lead}:{names[i]}" for i in cell_columns]
    reader_idx = np.array([readers.index(v) for v in data["reader"]])
    frames, frame_idx = np.unique(data["frame"], return_inverse=True)
    unit_keys = data["unit"].astype(str) + "|" + data["reader"].astype(str)
    units, unit_idx = np.unique(unit_keys, return_inverse=True)
    return GateCData(y, X, names, W, w_names, cell_columns, reader_idx, frame_idx, unit_idx, len(frames),
                     len(units), levels, sig, readers, tuple(covariates))


def build_gate_c_model(d: GateCData, priors: GateCPriors):
    """Named variables: ``intercept``, ``beta`` (shared), ``reader_beta`` (reader factor),
    ``frame_sd``/``z_frame``, ``unit_sd``/``z_unit``, ``sigma`` (dims reader), ``nu``."""
    import pymc as pm

    p = priors.base
    coords = {"fixed": d.names, "reader_fixed": d.w_names, "reader": list(d.readers)}
    with pm.Model(coords=coords) as model:
        intercept = pm.Normal("intercept", 0.0, p.intercept_sd)
        beta = pm.Normal("beta", 0.0, p.fixed_sd, dims="fixed")
        reader_beta = pm.Normal("reader_beta", 0.0, priors.reader_factor_sd, dims="reader_fixed")
        frame_sd = pm.HalfNormal("frame_sd", p.group_sd)
        z_frame = pm.Normal("z_frame", 0.0, 1.0, shape=d.n_frames)
        unit_sd = pm.HalfNormal("unit_sd", p.group_sd)
        z_unit = pm.Normal("z_unit", 0.0, 1.0, shape=d.n_units)
        sigma = pm.HalfNormal("sigma", p.residual_sd, dims="reader")
        nu = pm.Gamma("nu", alpha=p.nu_alpha, beta=p.nu_beta)
        mu = (intercept + pm.math.dot(d.X, beta) + pm.math.dot(d.W, reader_beta)
              + frame_sd * z_frame[d.frame] + unit_sd * z_unit[d.unit])
        pm.StudentT("y", nu=nu, mu=mu, sigma=sigma[d.reader], observed=d.y)
    return model


def reader_h2(idata, d: GateCData, band: Sequence, threat: str = "threat",
              harmless: str = "harmless") -> dict[str, np.ndarray]:
    """Each reader's standardised H2 (D3), cell means averaged with equal weight over the band
    depths and over the nuisance factors (their sum-coded columns at zero, as cell_row does)."""
    post = idata.posterior
    flat = lambda name: post[name].values.reshape(-1, *post[name].values.shape[2:])  # noqa: E731
    intercept, beta, reader_beta = flat("intercept"), flat("beta"), flat("reader_beta")
    out = {}
    for reader in d.readers:
        r = sum_columns([reader], d.readers)[0, 0]
        mu = {}
        for agent in d.levels["agent"]:
            for content in d.levels["content"]:
                row = np.mean([cell_row(agent, content, depth, d.levels, len(d.covariates)) for depth in band],
                              axis=0)
                w = r * np.concatenate([[1.0], row[d.cell_columns]])
                mu[(agent, content)] = intercept + beta @ row + reader_beta @ w
        out[reader] = hypotheses(mu, threat, harmless)["H2"]
    return out


def gate_c_contrast(idata, d: GateCData, band: Sequence) -> np.ndarray:
    """Gate (c): draws of standardised H2(tested) - standardised H2(judge)."""
    h2 = reader_h2(idata, d, band)
    return h2[d.readers[0]] - h2[d.readers[1]]
