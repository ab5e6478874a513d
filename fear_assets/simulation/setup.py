"""Per-process set-up of the power simulation's fits (protocol 6.3; D7): the sampler a family
runs under (the embedded demo's shorter one is registered in settings ``power.demo``), one
compiled Fitter per sampler and process, and the key naming one simulation run."""

from __future__ import annotations

import json

import pandas as pd

from fear_assets.analysis.primary_model import Fitter, Priors
from fear_assets.hashing import sha256_obj
from fear_assets.registration.record import analysis_code_sha256


def sampler_of(settings, family_key: str) -> dict:
    s = settings.power.demo.sampler if settings.family(family_key).role == "embedded" else settings.sampler
    return {"draws": s.draws, "tune": s.tune, "chains": s.chains}


FITTERS: dict = {}


def fitter_for(settings, family_key: str, frames: str = "non_centred"):
    """One Fitter per sampler set-up and process: the model compiles once per shape (D7).
    ``frames``: the primary model's frame-effect parametrisation (``sampling.frame_parametrisation``)."""

    s = sampler_of(settings, family_key)
    key = (settings.sha256, s["draws"], s["tune"], s["chains"], frames)
    if key not in FITTERS:
        FITTERS[key] = Fitter(Priors.from_settings(settings), int(s["draws"]), int(s["tune"]), int(s["chains"]),
                              frames=frames)
    return FITTERS[key]


def run_key(settings, family_key: str, estimates: pd.DataFrame) -> str:

    return sha256_obj([settings.sha256, analysis_code_sha256(), family_key,
                       json.loads(estimates["estimates_json"].iloc[0]), estimates["band"].iloc[0]])[:16]
