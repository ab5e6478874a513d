"""Gate (c), the foreign judge (protocol 4.8, 6.2): one joint model of two readers.

"Because the two models have different tokenizers and calibration, each reader's H2 is
standardised by that reader's own residual standard deviation, and the gate compares the
standardised contrasts in one joint model with a reader factor and reader-specific
variances." (4.8) "In the joint model, the reader factor has a Normal(0, 0.5) prior and the
reader-specific residual scales half-Normal(0, 0.5) priors." (6.2)

The joint model is ``analysis.joint``'s two-block model with the reader as the block factor:
the primary model's full structure (shared fixed effects; frame intercept and frame-level
slopes for agent, content and agent x content, six correlated effects with LKJ(2) and
half-Normal(0, 0.5) scales; a unit intercept), a sum-coded reader factor interacted with
agent x content x depth (Normal(0, reader_factor_sd)), reader-specific residual scales and
a Student-t likelihood. Each reader's Delta is divided by that reader's pilot trial-level
residual SD first (y = Delta / sigma_reader), so both contrasts and the ROPE share one fixed
scale. The frame effects are shared by the two readers (reading taken: both readers read
the same frames, so a frame's effects are paired across them, as the primary cells and a
control's cells are), and each reader has its own frame deviations of the agent x content
slopes (the gate's terms; ``joint``: + for the tested reader, - for the judge, LKJ(2) and
half-Normal(0, 0.5) scales, the registered priors on every random-effect correlation and
SD), so frame-to-frame variation of the tested-minus-judge H2 widens the gate's HDI rather
than entering the residual (which made a gate read Supported that should be Unresolved,
D5 row 10 for row 9); units are per reader, since the judge's documents carry its own
system prompt. Each reader's covariates are its own surprisals, centred on its own bank
means (the caller builds each reader's model table from that reader's surprisal table).
The gate's estimand is the standardised H2 of the tested model minus that of the judge,
averaged over the band depths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.joint import JointData, block_hypotheses, build_joint_model, prepare_joint
from fear_assets.models.primary_model import COVARIATES, Priors
from fear_assets.models.decision import Decision, label

READERS = ("tested", "judge")

#: The gate's data are the joint model's (kept under the old name for callers).
GateCData = JointData


@dataclass(frozen=True)
class GateCPriors:
    """The primary model's priors plus the reader factor's Normal(0, reader_factor_sd)."""

    base: Priors
    reader_factor_sd: float

    @classmethod
    def from_settings(cls, settings) -> "GateCPriors":
        return cls(Priors.from_settings(settings), settings.priors.gate_c_reader_factor_sd)


def gate_c_bounds(sigma_pilot: float, sesoi: float, meaningful: float) -> tuple[float, float]:
    """(ROPE half-width, meaningful size) on the standardised scale: sesoi/sigma and
    meaningful/sigma (6.2), sigma being the pilot's primary-model trial-level residual SD,
    the only value inserted at registration."""
    if not (isinstance(sigma_pilot, (int, float)) and math.isfinite(sigma_pilot) and sigma_pilot > 0):
        raise ValueError(f"sigma_pilot must be a positive, finite residual SD; got {sigma_pilot!r}: "
                         f"insert the pilot primary model's trial-level residual SD")
    return sesoi / sigma_pilot, meaningful / sigma_pilot


def gate_c_decision(hdi_low: float, hdi_high: float, sigma_pilot: float, sesoi: float,
                    meaningful: float) -> Decision:
    """Gate (c)'s label by the 6.2 rule with the ROPE +-sesoi/sigma; "practically meaningful"
    is the stricter criterion of 6.2, "an HDI entirely beyond the ROPE" (wholly above
    +sesoi/sigma). The meaningful size meaningful/sigma is the simulation's target effect (6.3),
    not this qualifier's threshold."""
    rope, _ = gate_c_bounds(sigma_pilot, sesoi, meaningful)
    return label(hdi_low, hdi_high, rope)


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
                   reader_factor_sd: float, outcome: str = "delta", covariates: Sequence[str] = COVARIATES,
                   readers: Sequence[str] = READERS) -> JointData:
    """``data``: the primary model's columns plus ``reader`` (one of ``readers``), both
    readers' trials stacked, each reader's covariates from its own surprisals and already
    centred on its own bank means (``data.model_table`` with that reader's table)."""
    readers = tuple(readers)
    if "reader" not in data.columns:
        raise ValueError("gate (c) data lack column(s) ['reader']: add it (the primary model's columns plus 'reader')")
    sig = _reader_sigmas(sigmas, readers)
    return prepare_joint(data, levels, "reader", readers, reader_factor_sd, per_block_sigma=True, outcome=outcome,
                         covariates=covariates, scale=sig)


def build_gate_c_model(d: JointData, priors: GateCPriors):
    """The joint two-reader model (``joint.build_joint_model``): ``block_beta`` is the reader
    factor, ``sigma`` has one scale per reader."""
    if d.factor_sd != priors.reader_factor_sd:
        raise ValueError(f"the data were prepared with reader-factor sd {d.factor_sd}, the priors say "
                         f"{priors.reader_factor_sd}: prepare with GateCPriors.reader_factor_sd")
    return build_joint_model(d, priors.base)


def reader_h2(idata, d: JointData, band: Sequence) -> dict[str, np.ndarray]:
    """Each reader's standardised H2 (D3), cell means averaged with equal weight over the band
    depths and over the nuisance factors."""
    return {reader: h["H2"] for reader, h in block_hypotheses(idata, d, band).items()}


def gate_c_contrast(idata, d: JointData, band: Sequence) -> np.ndarray:
    """Gate (c): draws of standardised H2(tested) - standardised H2(judge)."""
    h2 = reader_h2(idata, d, band)
    return h2[d.blocks[0]] - h2[d.blocks[1]]
