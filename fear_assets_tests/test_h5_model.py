"""Parameter recovery and input checks for the H5 probit (protocol 6.1; D3, D3b)."""

import itertools

import arviz as az
import numpy as np
import pandas as pd
import pytest
from scipy.special import ndtr

from fear_assets.models.h5_model import H5Priors, build_h5_model, h5_contrast, prepare_h5
from fear_assets.models.primary_model import sample

CELLS = [(a, c) for a in ("self", "peer", "person") for c in ("threat", "harmless")]
DPRIME = {("self", "threat"): 1.2, ("self", "harmless"): 0.4, ("peer", "threat"): 0.6,
          ("peer", "harmless"): 0.6, ("person", "threat"): 0.7, ("person", "harmless"): 0.5}


def simulate(frames=10, trials=40, removed=2, seed=0):
    """Choices from the model's structure: criterion = 0.1 + 0.2 x position (sum-coded) + a
    frame intercept; d' per cell plus small per-frame deviations; ``trials`` content trials
    per frame and cell (half with option 1 shown) and ``removed`` content-removed ones."""
    rng = np.random.default_rng(seed)
    frame_c = rng.normal(0, 0.2, frames)
    frame_dp = rng.normal(0, 0.1, (frames, len(CELLS)))
    rows = []
    for f, (k, cell) in itertools.product(range(frames), enumerate(CELLS)):
        shown = [1, 2] * (trials // 2) + [0] * removed
        for i, option in enumerate(shown):
            first = i % 4 < 2
            s = {1: 1.0, 2: -1.0, 0: 0.0}[option]
            eta = 0.1 + (0.2 if first else -0.2) + frame_c[f] + 0.5 * (DPRIME[cell] + frame_dp[f, k]) * s
            rows.append({"agent": cell[0], "content": cell[1], "frame": f"F{f}", "shown_option": option,
                         "option1_first": first, "chose_option1": bool(rng.random() < ndtr(eta))})
    return pd.DataFrame(rows)


def test_known_h5_is_recovered(settings):
    d = prepare_h5(simulate(), CELLS)
    idata = sample(build_h5_model(d, H5Priors.from_settings(settings)), draws=300, tune=300, chains=2, seed=1)
    h5 = h5_contrast(idata, CELLS)
    low, high = az.hdi(h5, hdi_prob=settings.decision.hdi_prob)
    assert low < 0.8 < high
    assert low > 0.0


def test_priors_come_from_the_settings(settings):
    p = H5Priors.from_settings(settings)
    assert (p.fixed_sd, p.group_sd, p.lkj_eta) == (1.0, 0.5, 2.0)


def test_bad_inputs_name_the_column():
    data = simulate(frames=2, trials=4, removed=2)
    with pytest.raises(ValueError, match="shown_option"):
        prepare_h5(data.assign(shown_option=3), CELLS)
    with pytest.raises(ValueError, match="chose_option1"):
        prepare_h5(data.assign(chose_option1="A"), CELLS)
    with pytest.raises(ValueError, match="option1_first"):
        prepare_h5(data.drop(columns="option1_first"), CELLS)
    with pytest.raises(ValueError, match="not among the cells"):
        prepare_h5(data, CELLS[:-1])
    d = prepare_h5(data, CELLS)
    assert d.X.shape == (len(data), 1 + len(CELLS) - 1)
    assert set(d.s) == {-1.0, 0.0, 1.0}


def test_content_removed_trials_do_not_inform_dprime(settings):
    """An s = 0 row's log-likelihood must not move with d' (fixed or per-frame); an s != 0
    row's must."""
    data = simulate(frames=2, trials=4, removed=2)
    d = prepare_h5(data, CELLS)
    model = build_h5_model(d, H5Priors.from_settings(settings))
    logp = model.compile_fn(model.logp(vars=[model["chose_option1"]], sum=False, jacobian=False)[0],
                            inputs=model.value_vars, on_unused_input="ignore")
    point = model.initial_point()
    base = logp(point)
    moved = dict(point, dprime=np.linspace(-2, 2, len(CELLS)),
                 z_dprime_frame=np.full(point["z_dprime_frame"].shape, 1.5))
    changed = logp(moved)
    removed = d.s == 0
    assert removed.any() and (~removed).any()
    np.testing.assert_allclose(changed[removed], base[removed], rtol=0, atol=1e-12)
    assert np.all(np.abs(changed[~removed] - base[~removed]) > 1e-6)
