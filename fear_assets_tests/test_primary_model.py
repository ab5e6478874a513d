"""Parameter recovery for the registered primary model (protocol 6.1; D3, D3b)."""

import itertools
from dataclasses import replace

import arviz as az
import numpy as np
import pandas as pd
import pytest

import fear_assets
from fear_assets.models.coding import sum_columns
from fear_assets.models.primary_model import (Priors, build_model, cell_means, hypotheses, posterior_draws,
                                                prepare, sample)

LEVELS = {"agent": ["self", "peer", "person"], "content": ["threat", "harmless"], "depth": ["d1", "d2"],
          "order": [1, 2], "option": [1, 2], "rotation": [1, 2, 3],
          "fear": ["termination", "uncertainty", "isolation", "inferiority", "identity_loss"]}


def simulate(effects: dict[str, float], frames=10, seed=0, residual=0.15, h2_frame_sd=0.0, h2_frame_offset=0.0):
    """Data from the model's structure with a known threat-minus-harmless effect per agent.
    ``h2_frame_sd``: frame slopes too, the self agent's threat-minus-harmless effect varying by
    frame (so H2 does) with that SD, the realised frames' deviations averaging
    ``h2_frame_offset`` (a sample of frames off its population mean, as ten frames can be)."""
    rng = np.random.default_rng(seed)
    frame_sd = rng.normal(0, 0.05, size=(frames, 6))
    slope = np.random.default_rng([seed, 1]).normal(0, h2_frame_sd, frames)  # own stream: h2_frame_sd=0 is unchanged
    slope = slope - slope.mean() + h2_frame_offset if h2_frame_sd else slope
    rows = []
    for f, rot, order, depth in itertools.product(range(frames), (1, 2, 3), (1, 2), ("d1", "d2")):
        unit = f"F{f}|r{rot}|o{order}|{depth}"
        u = rng.normal(0, 0.1)
        for cell, (agent, content) in enumerate(itertools.product(LEVELS["agent"], LEVELS["content"]), start=1):
            k = rot + 3 * (order - 1)
            option = 1 if (k + int(depth[1:]) + cell) % 2 == 0 else 2
            sign = 0.5 if content == "threat" else -0.5
            mean = -0.3 + (effects[agent] + slope[f] * (agent == "self")) * sign + frame_sd[f, 0] + u
            rows.append({"agent": agent, "content": content, "depth": depth, "order": order, "option": option,
                         "rotation": rot, "fear": LEVELS["fear"][f % 5], "frame": f"F{f}", "unit": unit,
                         "surprisal_name": rng.normal(0, 0.2), "surprisal_rest": rng.normal(0, 0.2),
                         "delta": mean + rng.normal(0, residual)})
    return pd.DataFrame(rows)


def fit(data, settings, seed=1, frame_effects=6):
    """``frame_effects=4``: a model without the agent x content frame slopes (the check that
    a recovery test would catch their absence)."""
    d = prepare(data, LEVELS)
    d = replace(d, Z=d.Z[:, :frame_effects])
    idata = sample(build_model(d, Priors.from_settings(settings)), draws=300, tune=400, chains=2, seed=seed)
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), ["d1", "d2"])
    return idata, hypotheses(mu)


def _label(draws, settings):
    low, high = az.hdi(draws, hdi_prob=settings.decision.hdi_prob)
    return (low, high), fear_assets.label(low, high, settings.decision.sesoi)


def test_sum_to_zero_coding():
    cols = sum_columns(["a", "b", "c", "a"], ["a", "b", "c"])
    assert cols.tolist() == [[1, 0], [0, 1], [-1, -1], [1, 0]]
    with pytest.raises(ValueError, match="not among the levels"):
        sum_columns(["d"], ["a", "b"])


#: The recovery tests' data: H2 = 0.8 in the population, varying by frame (SD 0.4) with the ten
#: frames' deviations averaging +0.2, so a model that puts the frame slopes into the residual
#: centres a too-narrow HDI near 1.0 and misses the truth.
SLOPED = dict(h2_frame_sd=0.4, h2_frame_offset=0.2)


def test_known_h2_is_recovered_and_labelled(settings):
    data = simulate({"self": 0.8, "peer": 0.0, "person": 0.0}, **SLOPED)
    _, h = fit(data, settings)
    (low, high), decision = _label(h["H2"], settings)
    assert low < 0.8 < high
    assert decision.label == "supported"
    (low1, high1), _ = _label(h["H1"], settings)
    assert low1 < 0.8 / 3 < high1


# A second fit that shows the recovery test can fail; run with -m slow (its figures: README).
@pytest.mark.slow
def test_the_recovery_data_fail_a_model_without_frame_slopes(settings):
    """The recovery test above is a test of the frame slopes: the same data through the model
    without the agent x content frame slopes give an H2 HDI that misses the truth."""
    data = simulate({"self": 0.8, "peer": 0.0, "person": 0.0}, **SLOPED)
    _, h = fit(data, settings, frame_effects=4)
    (low, high), _ = _label(h["H2"], settings)
    assert not low < 0.8 < high, f"HDI [{low:.3f}, {high:.3f}] still covers 0.8 without frame slopes"


def test_a_null_h2_is_practically_equivalent(settings):
    data = simulate({"self": 0.3, "peer": 0.3, "person": 0.3}, frames=12, residual=0.1, seed=3)
    _, h = fit(data, settings, seed=2)
    (low, high), decision = _label(h["H2"], settings)
    assert low < 0.0 < high
    assert decision.label == "practically_equivalent"


# Slow (a compilation and two 700-step fits). The default run keeps the rule through stronger tests:
# test_power's swapped data equal a fresh compile's draws, and test_design_cells' do so with a cell fewer.
@pytest.mark.slow
def test_a_refit_through_the_compiled_model_reads_its_new_data(settings):
    """Fitter compiles once per shape; a second dataset of the same shape goes through
    nutpie's with_data and must give its own answer, not the first dataset's."""
    from fear_assets.models.primary_model import Fitter

    fitter = Fitter(Priors.from_settings(settings), draws=300, tune=400, chains=2, cache=[])  # compiles here
    first = prepare(simulate({"self": 0.8, "peer": 0.0, "person": 0.0}, frames=6, seed=4), LEVELS)
    second = prepare(simulate({"self": -0.8, "peer": 0.0, "person": 0.0}, frames=6, seed=5), LEVELS)
    results = []
    for d in (first, second):
        idata = fitter.fit(d, seed=3)
        mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), ["d1", "d2"])
        results.append(hypotheses(mu)["H2"].mean())
    assert fitter.compilations == 1
    assert results[0] > 0.5 and results[1] < -0.5
