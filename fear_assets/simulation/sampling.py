"""Sampler set-ups for the simulation's fits (6.3): the frame effects' parametrisation, and
a warm start kept only where it matches a long run.

``frame_parametrisation`` picks, per simulation run, how the primary model's frame effects
are sampled (both forms leave the joint prior as registered, D3b). Centring pays where each
frame's data pin its effects down more than the group scale does: at registered size (288
rows a frame, the generator's realistic variance components) it reached ESS 400 on every
contrast 1.78x sooner, where the non-centred form left H1 at the rule's edge; with no
frame-slope variance it diverged (benchmarks/reparam.py, RESULTS.md). The generating scales are
known in a simulation, so the choice is made from them.

Every simulated dataset of a family shares the design, so the posterior geometry barely
changes between datasets. ``WarmStartFitter`` compiles the registered model once per shape
(as ``Fitter`` does) and starts each dataset's chains from a reference fit: its posterior
mean in the unconstrained space (nutpie's ``init_mean``) and its adapted step size
(``initial_step``), with a shorter tuning phase. The model and priors are untouched.
``benchmarks/power.py`` measures whether its 99% HDIs stay within 0.02 of a long run on the
same datasets; it is used only where that holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fear_assets.analysis.primary_model import Fitter, student_t_sd


#: Centre only where every frame effect's generating SD is at least this multiple of its
#: per-frame standard error. In a normal hierarchy the break-even is 1; with six correlated
#: effects the well-pinned frame intercept weighs more: benchmarks/reparam.py measured the
#: centred form far better at ratios down to 0.9 (5 and 50 frames, realistic scales) and far
#: worse at 0 (no slope variance), so the line is drawn between, at 0.5.
CENTRING_MIN_RATIO = 0.5
#: ... and only with this many frames (the registered simulation's least). With few frames the
#: frame scales themselves stay uncertain, and at 5 frames the measurements split: centred
#: better on the quick benchmark's data, non-centred better on the embedded demo's (no
#: divergences against 3-20 per fit; RESULTS.md "Frame effects").
CENTRING_MIN_FRAMES = 50


def frame_parametrisation(frame_sd: Sequence[float], residual_sd: float, Z: np.ndarray, frame: np.ndarray,
                          n_frames: int) -> str:
    """"centred" where there are at least ``CENTRING_MIN_FRAMES`` frames and, for every frame
    effect j, the generating SD ``frame_sd[j]`` is at least ``CENTRING_MIN_RATIO`` times its
    per-frame standard error ``residual_sd / sqrt(sum of Z[:, j]^2 over a frame's rows)``
    (averaged over frames); "non_centred" otherwise. Pure."""
    if n_frames < CENTRING_MIN_FRAMES:
        return "non_centred"
    sd = np.asarray(frame_sd, dtype=float)[:Z.shape[1]]
    information = np.stack([np.bincount(frame, weights=Z[:, j] ** 2, minlength=n_frames)
                            for j in range(Z.shape[1])], axis=1).mean(axis=0)
    standard_error = residual_sd / np.sqrt(np.maximum(information, 1e-300))
    return "centred" if bool(np.all(sd >= CENTRING_MIN_RATIO * standard_error)) else "non_centred"


def simulated_frame_parametrisation(est, design, inflation: float) -> str:
    """:func:`frame_parametrisation` at a simulation's generating values: the pilot frame SDs
    with the slopes inflated (``generator.frame_covariance``) and the Student-t residual's SD
    (its scale where nu <= 2, which has no SD)."""
    from fear_assets.simulation.generator import frame_covariance

    sd = np.sqrt(np.diag(frame_covariance(est, inflation)))
    residual = float(student_t_sd(est.sigma, est.nu)) if est.nu > 2.0 else est.sigma
    d = design.data
    return frame_parametrisation(sd, float(residual), d.Z, d.frame, d.n_frames)


@dataclass(frozen=True)
class WarmStart:
    init_mean: np.ndarray  # unconstrained posterior mean of the reference fit
    step_size: float  # the reference fit's final adapted step size (mean over chains)


def warm_start_from(idata) -> WarmStart:
    """Warm start from a fit sampled with ``store_unconstrained=True``."""
    stats = idata.sample_stats
    if "unconstrained_draw" not in stats:
        raise ValueError("the reference fit has no unconstrained draws: sample it with store_unconstrained=True")
    u = stats["unconstrained_draw"].values
    mean = u.reshape(-1, u.shape[-1]).mean(axis=0)
    return WarmStart(mean, float(stats["step_size"].values[:, -1].mean()))


class WarmStartFitter(Fitter):
    """``Fitter`` with warm-started chains (see module docstring); ``warm`` None samples cold."""

    def __init__(self, priors, draws: int, tune: int, chains: int, warm: WarmStart | None = None,
                 store_unconstrained: bool = False, cache: list | None = None, frames: str = "non_centred",
                 predictor: str = "cells"):
        super().__init__(priors, draws, tune, chains, cache, frames, predictor)
        self.warm, self.store_unconstrained = warm, store_unconstrained

    def sample_options(self) -> dict:
        extra = {}
        if self.warm is not None:
            extra = {"init_mean": self.warm.init_mean, "initial_step": self.warm.step_size}
        if self.store_unconstrained:
            extra["store_unconstrained"] = True
        return extra
