"""Sampler set-ups for the simulation's fits (6.3): the frame effects' parametrisation, and
a warm start kept only where it matches a long run.

How a simulated dataset's frame effects are sampled is decided by the one registered rule
that the analysis applies to its data (``analysis.parametrisation.frame_parametrisation``,
settings ``fitting.frame_parametrisation``), on that dataset: so the power gate validates the
fitting path the analysis takes. :func:`frame_forms` counts what the rule picked, for the
registration record's power section.

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

import numpy as np
import pandas as pd

from fear_assets.models.primary_model import Fitter


def frame_forms(labels: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per frame count, how many simulated datasets' primary fits the registered rule sampled
    centred or non-centred (from a label table's H2 rows; {} where the table predates the
    ``frame_parametrisation`` column). Pure."""
    if "frame_parametrisation" not in labels or labels.empty:
        return {}
    h2 = labels[(labels["contrast"] == "H2") & labels["frame_parametrisation"].notna()]
    return {str(int(frames)): {str(k): int(v) for k, v in part["frame_parametrisation"].value_counts().items()}
            for frames, part in h2.groupby("frames")}


def frame_forms_record(rule, labels: pd.DataFrame) -> dict:
    """The record's power-section entry for D3b: the registered rule's thresholds and, per
    frame count, the forms it picked for the simulated primary fits (the analysis applies the
    same rule to its data). ``rule``: the settings' ``fitting.frame_parametrisation``. Pure."""
    return {"rule": dict(vars(rule)), "primary_fits_by_form": frame_forms(labels)}


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
                 predictor: str = "cells", rule=None):
        super().__init__(priors, draws, tune, chains, cache, frames, predictor, rule)
        self.warm, self.store_unconstrained = warm, store_unconstrained

    def sample_options(self) -> dict:
        extra = {}
        if self.warm is not None:
            extra = {"init_mean": self.warm.init_mean, "initial_step": self.warm.step_size}
        if self.store_unconstrained:
            extra["store_unconstrained"] = True
        return extra
