"""The one registered rule that chooses how a primary-model fit samples its frame effects
(D3b; settings ``fitting.frame_parametrisation``), used alike by the confirmatory analysis,
the pilot's fits and the power simulation (6.3: the simulation validates the path the
analysis takes).

Both forms leave the joint prior exactly as registered (``test_reparametrisation.py``), so
they share one posterior and differ only in how NUTS sees it. Centring pays where each
frame's data pin its effects down more than the group scale does (a frame effect's
between-frame SD well above its per-frame standard error); non-centring pays where the data
say little about a frame (few rows, a scale near zero), the funnel of the centred form.

The rule reads only the fitted dataset (its design and outcome), never a generating value,
so a simulated dataset and a confirmatory dataset of the same design go through the same
decision: per frame, least squares of the pooled residual on that frame's slope columns gives
each frame effect's estimate and standard error; the between-frame SD is the method-of-moments
excess of the estimates' variance over the mean squared standard error (floored at 0). The
form is centred where there are at least ``centring_min_frames`` frames and every effect's
SD is at least ``centring_min_ratio`` standard errors; non-centred otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CENTRED, NON_CENTRED = "centred", "non_centred"


@dataclass(frozen=True)
class FrameScales:
    """What the rule measured on one dataset (recorded with each fit)."""

    frame_sd: tuple[float, ...]  # between-frame SD of each frame effect (moment estimate)
    standard_error: tuple[float, ...]  # each effect's per-frame standard error (mean over frames)
    n_frames: int

    def ratios(self) -> tuple[float, ...]:
        return tuple(float(s / max(e, 1e-300)) for s, e in zip(self.frame_sd, self.standard_error))


def frame_scales(y: np.ndarray, X: np.ndarray, Z: np.ndarray, frame: np.ndarray, n_frames: int) -> FrameScales:
    """Moment estimates of each frame effect's between-frame SD and per-frame standard error
    (module docstring). Pure. The pooled residual of ``y`` on the fixed design ``X`` carries
    the frame effects; within each frame its least squares on the frame's rows of ``Z`` gives
    the frame's effects and, from the pooled within-frame residual variance, their standard
    errors. A frame whose slope columns are not of full rank has no separate estimate and is
    left out of both moments."""
    y, X, Z = np.asarray(y, float), np.asarray(X, float), np.asarray(Z, float)
    frame = np.asarray(frame, int)
    fixed, *_ = np.linalg.lstsq(X, y, rcond=None)
    r = y - X @ fixed
    k = Z.shape[1]
    estimates, inverse_info, sse, dof = [], [], 0.0, 0
    for f in range(n_frames):
        rows = frame == f
        Zf, rf = Z[rows], r[rows]
        info = Zf.T @ Zf
        if rows.sum() <= k or np.linalg.matrix_rank(info) < k:
            continue
        inv = np.linalg.inv(info)
        b = inv @ Zf.T @ rf
        estimates.append(b)
        inverse_info.append(np.diag(inv))
        sse += float(((rf - Zf @ b) ** 2).sum())
        dof += int(rows.sum()) - k
    if len(estimates) < 2 or dof <= 0:
        return FrameScales(tuple([0.0] * k), tuple([np.inf] * k), n_frames)
    b, inv_diag = np.array(estimates), np.array(inverse_info)
    residual_var = sse / dof
    se2 = residual_var * inv_diag  # frames x effects
    excess = b.var(axis=0, ddof=1) - se2.mean(axis=0)
    return FrameScales(tuple(float(v) for v in np.sqrt(np.maximum(excess, 0.0))),
                       tuple(float(v) for v in np.sqrt(se2.mean(axis=0))), n_frames)


def choose_form(scales: FrameScales, min_ratio: float, min_frames: int) -> str:
    """Centred where ``scales.n_frames >= min_frames`` and every effect's SD is at least
    ``min_ratio`` times its standard error; non-centred otherwise. Pure."""
    if scales.n_frames < min_frames:
        return NON_CENTRED
    return CENTRED if all(r >= min_ratio for r in scales.ratios()) else NON_CENTRED


def frame_parametrisation(d, rule) -> str:
    """The registered rule on one fit's data ``d`` (``PrimaryData``; ``rule``: the settings'
    ``fitting.frame_parametrisation`` section): "centred" or "non_centred"."""
    return choose_form(frame_scales(d.y, d.X, d.Z, d.frame, d.n_frames), rule.centring_min_ratio,
                       rule.centring_min_frames)
