"""Gate (c)'s scale when the pilot's residual has no finite SD (6.2; found by the gemma-2-9b
rehearsal, whose random-weight pilot fit put nu <= 2 on all 200 draws and stopped the pilot).

6.2: the gate's ROPE and meaningful size are "0.15/sigma and 0.30/sigma, where sigma is the
trial-level residual standard deviation of the primary model in the pilot", and each reader is
standardised by its own. A Student-t residual with nu <= 2 has no SD, so no sigma exists: that
must be a failed registration gate that says so (the positive controls and every other pilot
gate still read), never a crash of the pilot, and the confirmatory gate (c) must then say it is
not available rather than divide by infinity."""

from __future__ import annotations

import json
import math

import arviz as az
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from fear_assets.analysis.confirmatory import Inputs, Registered, Result, gate_c
from fear_assets.analysis.gate_c import GateCPriors
from fear_assets.models.primary_model import implied_residual_sd
from fear_assets.pilot.gate_c_scale import reader_sigma, sigma_gate
from fear_assets.registration.compose import pilot_sigmas
from fear_assets.registration.gate_table import FIXES, gate_fix
from fear_assets_tests.test_audit_10a import FEARS, _surprisal, simulate


def _fit(nu, sigma=0.4):
    """A stand-in for the pilot fit: its posterior draws of the residual scale and nu."""
    nu = np.asarray(nu, float)
    post = xr.Dataset({"sigma": (("chain", "draw"), np.full((1, nu.size), sigma)),
                       "nu": (("chain", "draw"), nu.reshape(1, -1))})
    return lambda table: az.InferenceData(posterior=post)


PILOT = pd.DataFrame({"delta": [0.1, -0.2]})  # any non-empty pilot table (the fit is the stand-in)


def test_a_pilot_residual_without_a_finite_sd_is_infinite_not_a_crash():
    heavy = np.r_[np.full(150, 1.6), np.full(50, 3.0)]  # most draws nu <= 2: the SD does not exist
    assert reader_sigma(_fit(heavy), PILOT, "tested") == math.inf
    assert reader_sigma(_fit(heavy), PILOT, "judge") == math.inf
    light = np.r_[np.full(50, 1.6), np.full(150, 5.0)]  # a minority: the median SD is finite
    assert reader_sigma(_fit(light), PILOT, "tested") == pytest.approx(implied_residual_sd(_fit(light)(PILOT)))
    assert math.isnan(reader_sigma(_fit(light), PILOT.iloc[:0], "judge"))  # judge block not scored
    with pytest.raises(ValueError, match="score the pilot first"):
        reader_sigma(_fit(light), PILOT.iloc[:0], "tested")


@pytest.mark.parametrize("tested, judge, passed, named", [
    (math.inf, 0.5, False, "tested"),
    (0.4, math.inf, False, "judge"),
    (0.4, float("nan"), True, None),  # the judge not scored: gate (c) is not available, not a failed scale
    (0.4, 0.5, True, None)])
def test_the_gate_c_scale_gate_fails_only_where_a_readers_sigma_does_not_exist(tested, judge, passed, named):
    gate = sigma_gate(tested, judge)
    assert gate["passed"] is passed
    if named:
        assert f"the {named} model's pilot residual has no finite SD" in gate["message"]
        assert "not finite" in gate["numbers"][f"{named} sigma"]
        # The fix says what to check and what it takes, not the message again.
        assert gate_fix("gate_c_scale (6.2)", False, gate["message"]) == FIXES["gate_c_scale"]
    json.dumps(gate, allow_nan=False)  # the record's numbers are plain JSON


def test_the_record_holds_no_infinite_sigma():
    sigmas = pilot_sigmas(pd.DataFrame([{"pilot_sigma": math.inf, "pilot_sigma_judge": float("nan")}]))
    assert sigmas == {"pilot_sigma": None, "pilot_sigma_judge": None}
    json.dumps(sigmas, allow_nan=False)
    assert pilot_sigmas(pd.DataFrame([{"pilot_sigma": 0.41234567, "pilot_sigma_judge": 0.5}])) == {
        "pilot_sigma": 0.412346, "pilot_sigma_judge": 0.5}


def test_gate_c_is_not_available_without_the_tested_models_scale(settings):
    reg = Registered(0.99, 0.15, 0.30, 1.0, settings.convergence, 0.05, 0.15, 0.0, 10, 10, 1)
    inputs = Inputs(scores=pd.DataFrame(), surprisal=_surprisal(), fears_of={}, fears=FEARS, neutral_option=1,
                    band=["d1"], h5_depth="d1", pilot_sigma=float("nan"), depth_tokens={}, prefix="", registered=reg,
                    seed=lambda name: 1, pilot_sigma_judge=0.5, gate_c_priors=GateCPriors.from_settings(settings),
                    judge_surprisal=_surprisal())
    out = Result()
    gate_c(inputs, simulate(frames=1), simulate(frames=1), out, fit_remedied=None)
    (row,) = out.rows
    assert row["status"] == "not_available" and "tested model's pilot residual SD is not finite" in row["note"]


def test_the_power_simulation_does_not_simulate_gate_c_without_a_scale_and_says_why(settings):
    """The power step read a judge sigma of +inf as a corrupt table and stopped (the gemma-2-9b
    rehearsal again); and a tested pilot fit with nu <= 2 has no scale to put gate (c)'s truth on.
    Both now leave gate (c) not simulated (not computable, never met), with the reason."""
    import dataclasses

    from fear_assets.simulation.generator import PRIMARY_MODEL_BLOCKS
    from fear_assets.simulation.pilot_scales import JUDGE_NOT_FINITE, NO_JUDGE, judge_note, pilot_judge_sigma
    from fear_assets.simulation.runner import Rules, not_simulated, truths
    from fear_assets_tests.test_power import _all_estimates

    infinite = pd.DataFrame({"pilot_sigma_judge": [math.inf, math.inf]})
    assert pilot_judge_sigma(infinite) is None and judge_note(None, infinite) == JUDGE_NOT_FINITE
    unscored = pd.DataFrame({"pilot_sigma_judge": [float("nan")]})
    assert pilot_judge_sigma(unscored) is None and judge_note(None, unscored) == NO_JUDGE
    with pytest.raises(ValueError, match="one positive value"):
        pilot_judge_sigma(pd.DataFrame({"pilot_sigma_judge": [0.4, 0.5]}))

    est = _all_estimates()
    assert "gate_c" not in not_simulated(est, PRIMARY_MODEL_BLOCKS)
    heavy = dataclasses.replace(est, nu=1.8)
    assert "no finite SD" in not_simulated(heavy, PRIMARY_MODEL_BLOCKS)["gate_c"]
    rules = Rules(0.99, 0.15, 0.30, settings.convergence, 0.15, 0.0, 1.5)
    assert truths("meaningful", rules, est)["gate_c"] > 0
    assert math.isnan(truths("meaningful", rules, heavy)["gate_c"])  # no truth: not simulated, not labelled
