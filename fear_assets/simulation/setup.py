"""Per-process set-up of the power simulation's fits (protocol 6.3; D7): the sampler a family
runs under (the embedded demo's shorter one is registered in settings ``power.demo``), one
compiled Fitter per sampler and process, and the key naming one simulation run."""

from __future__ import annotations

import json

import pandas as pd

from fear_assets.models.primary_model import Fitter, Priors
from fear_assets.core.hashing import sha256_obj
from fear_assets.core.registered import registered
from fear_assets.core.sections import Sampler
from fear_assets.registration.record import analysis_code_sha256


def sampler_of(settings, family_key: str) -> Sampler:
    """The sampler of a family's power-simulation fits (``Registered.power_sampler``)."""
    return registered(settings, family_key).power_sampler


FITTERS: dict = {}


def fitter_for(settings, family_key: str):
    """One Fitter per sampler set-up and process: the model compiles once per shape and form
    (D7). Each simulated dataset's frame-effect form is chosen by the registered rule on that
    dataset, as the analysis chooses it on its data (``analysis.parametrisation``)."""

    s = sampler_of(settings, family_key)
    key = (settings.sha256, s.draws, s.tune, s.chains)
    if key not in FITTERS:
        FITTERS[key] = Fitter(Priors.from_settings(settings), s.draws, s.tune, s.chains,
                              rule=settings.fitting.frame_parametrisation)
    return FITTERS[key]


def run_key(settings, family_key: str, estimates: pd.DataFrame) -> str:

    return sha256_obj([settings.sha256, analysis_code_sha256(), family_key,
                       json.loads(estimates["estimates_json"].iloc[0]), estimates["band"].iloc[0]])[:16]
