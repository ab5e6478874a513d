"""H5, use: the hierarchical Bayesian probit on trial-level forced choices (protocol 6.1, D3, D3b).

P(choose option 1) = Phi(c + 0.5 * d'_cell * s), s = +1 when option 1 was shown, -1 when
option 2 was shown and 0 on content-removed baseline trials, which therefore inform only the
criterion. c = intercept + sum-coded fixed effects of option position and cell + a frame
random intercept; d'_cell = one fixed effect per cell (no intercept) + correlated per-frame
deviations (LKJ on correlations, half-Normal scales). Both random effects are non-centred,
which leaves their joint prior unchanged (fear_assets_tests/test_reparametrisation.py shows
it). No aggregate rates are computed, so rates of 0 or 1 need no correction. H5 is the
posterior contrast d'(self, threat) - d'(self, harmless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from fear_assets.models.coding import sum_columns

H5_COLUMNS = ("agent", "content", "chose_option1", "shown_option", "option1_first", "frame")


@dataclass(frozen=True)
class H5Priors:
    """Priors on the probit scale (6.1): Normal(0, fixed_sd) on the d' and criterion fixed
    effects (intercept included), half-Normal(0, group_sd) on every sd, LKJ(lkj_eta)."""

    fixed_sd: float
    group_sd: float
    lkj_eta: float

    @classmethod
    def from_settings(cls, settings) -> "H5Priors":
        p = settings.priors
        return cls(p.h5_probit_fixed_sd, p.group_sd_halfnormal, p.lkj_eta)


@dataclass
class H5Data:
    """Model inputs built once from a forced-choice trial table (one row per trial)."""

    y: np.ndarray  # 1 when option 1 was chosen
    s: np.ndarray  # +1 option 1 shown, -1 option 2 shown, 0 content removed
    cell: np.ndarray  # index into cells
    X: np.ndarray  # criterion fixed effects (no intercept): option position, then cell
    names: list[str]
    frame: np.ndarray
    frames: list
    cells: list[tuple[str, str]]

    @property
    def n_frames(self) -> int:
        return len(self.frames)

    @property
    def cell_labels(self) -> list[str]:
        return [cell_label(c) for c in self.cells]


def cell_label(cell: tuple[str, str]) -> str:
    agent, content = cell
    return f"{agent}:{content}"


def _boolean(data: pd.DataFrame, column: str, meaning: str) -> np.ndarray:
    """A column that must hold only True/False (or 0/1): a missing or other value would
    silently become a choice, so it is refused."""
    values = data[column]
    ok = values.isin([True, False]) & values.notna()
    if not ok.all():
        bad = sorted(map(repr, set(values[~ok].tolist())))[:5]
        raise ValueError(f"column {column!r} must be True/False ({meaning}); found {', '.join(bad)} "
                         f"in {int((~ok).sum())} rows: recode it as booleans")
    return values.astype(bool).to_numpy()


def prepare_h5(data: pd.DataFrame, cells: Sequence[tuple[str, str]]) -> H5Data:
    """``data`` columns: agent, content, chose_option1 (bool), shown_option (1, 2, or 0 on
    content-removed trials), option1_first (bool) and frame; rows at the registered H5 depth
    only. ``cells`` fixes the order of the d' fixed effects and the sum-coding of the cell
    factor (its last cell is the implied level)."""
    cells = [tuple(c) for c in cells]
    if len(cells) < 2 or len(set(cells)) != len(cells):
        raise ValueError(f"cells must list at least two distinct (agent, content) pairs; got {cells}")
    missing = [c for c in H5_COLUMNS if c not in data.columns]
    if missing:
        raise ValueError(f"H5 data lacks column(s) {missing}: add them (needed: {list(H5_COLUMNS)})")
    if data.empty:
        raise ValueError("H5 data has no rows: pass the forced-choice trials at the H5 depth")
    if data["frame"].isna().any():
        raise ValueError(f"column 'frame' is missing in {int(data['frame'].isna().sum())} rows: fill it")
    y = _boolean(data, "chose_option1", "True when option 1 was chosen")
    first = _boolean(data, "option1_first", "True when option 1 was listed first")
    shown = data["shown_option"]
    ok = shown.isin([0, 1, 2]) & shown.notna()
    if not ok.all():
        bad = sorted(map(repr, set(shown[~ok].tolist())))[:5]
        raise ValueError(f"column 'shown_option' must be 1 or 2 (the option shown) or 0 (content removed); "
                         f"found {', '.join(bad)}: recode it")
    shown = shown.to_numpy(int)
    s = np.select([shown == 1, shown == 2], [1.0, -1.0], 0.0)
    pairs = list(zip(data["agent"], data["content"]))
    index = {c: i for i, c in enumerate(cells)}
    unknown = sorted({p for p in pairs if p not in index}, key=str)
    if unknown:
        raise ValueError(f"(agent, content) pairs {unknown[:5]} are not among the cells {cells}: "
                         f"drop those rows or pass their cells")
    cell = np.array([index[p] for p in pairs], dtype=int)
    # Sum-coded criterion: option 1 listed first (+1) vs second (-1), then the cell factor.
    position = sum_columns(first.tolist(), [True, False])
    cell_cols = sum_columns(cell.tolist(), list(range(len(cells))))
    X = np.column_stack([position, cell_cols])
    names = ["option1_first[True]"] + [f"cell[{cell_label(c)}]" for c in cells[:-1]]
    frames, frame_idx = np.unique(data["frame"].to_numpy(), return_inverse=True)
    return H5Data(y.astype(np.int64), s, cell, X, names, frame_idx, list(frames), cells)


def _probit_logp(value, eta):
    """log Phi(x), x = eta for a choice of option 1 and -eta otherwise, as
    log(erfcx(-x / sqrt 2) / 2) - x^2 / 2: one branch (the sampler's cost is per row) and no
    log(0) when x is far below zero, where log(Phi(x)) would underflow."""
    import pytensor.tensor as pt

    x = (2 * value - 1) * eta
    return pt.log(pt.erfcx(-x / np.sqrt(2.0)) / 2.0) - pt.sqr(x) / 2.0


def _probit_random(eta, rng=None, size=None):
    from scipy.special import ndtr

    return (rng.random(size) < ndtr(eta)).astype(np.int64)


def build_h5_model(d: H5Data, priors: H5Priors):
    """Named variables: ``dprime`` (dims cell, the population d' per cell), ``dprime_frame``
    (frame x cell deviations), ``criterion_intercept``, ``criterion_beta``,
    ``criterion_frame`` and the observed ``chose_option1``."""
    import pymc as pm

    k = len(d.cells)
    coords = {"cell": d.cell_labels, "criterion": d.names, "frame": [str(f) for f in d.frames]}
    with pm.Model(coords=coords) as model:
        intercept = pm.Normal("criterion_intercept", 0.0, priors.fixed_sd)
        beta = pm.Normal("criterion_beta", 0.0, priors.fixed_sd, dims="criterion")
        frame_sd = pm.HalfNormal("criterion_frame_sd", priors.group_sd)
        z_crit = pm.Normal("z_criterion_frame", 0.0, 1.0, dims="frame")
        crit_frame = pm.Deterministic("criterion_frame", frame_sd * z_crit, dims="frame")
        dprime = pm.Normal("dprime", 0.0, priors.fixed_sd, dims="cell")
        chol, _, _ = pm.LKJCholeskyCov("dprime_frame_chol", n=k, eta=priors.lkj_eta,
                                       sd_dist=pm.HalfNormal.dist(priors.group_sd), compute_corr=True)
        z_dp = pm.Normal("z_dprime_frame", 0.0, 1.0, dims=("frame", "cell"))
        dp_frame = pm.Deterministic("dprime_frame", z_dp @ chol.T, dims=("frame", "cell"))
        c = intercept + pm.math.dot(d.X, beta) + crit_frame[d.frame]
        dp = dprime[d.cell] + dp_frame[d.frame, d.cell]
        eta = c + 0.5 * dp * d.s
        pm.CustomDist("chose_option1", eta, logp=_probit_logp, random=_probit_random, dtype="int64",
                      observed=d.y)
    return model


def h5_contrast(idata, cells: Sequence[tuple[str, str]], self_threat: tuple[str, str] = ("self", "threat"),
                self_harmless: tuple[str, str] = ("self", "harmless")) -> np.ndarray:
    """H5 (D3): flattened posterior draws of d'(self, threat) - d'(self, harmless)."""
    labels = [cell_label(tuple(c)) for c in cells]
    for cell in (self_threat, self_harmless):
        if cell_label(cell) not in labels:
            raise ValueError(f"cell {cell} is not among the fitted cells {list(cells)}: "
                             f"pass the cells used in prepare_h5")
    dprime = idata.posterior["dprime"]
    diff = dprime.sel(cell=cell_label(self_threat)) - dprime.sel(cell=cell_label(self_harmless))
    return diff.values.reshape(-1)
