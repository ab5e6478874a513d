"""The primary model's mu evaluated per distinct design row (``primary_model.design_cells``,
``predictor="cells"``) is the registered mu: the cells rebuild the design exactly, the model's
log density and its gradient equal the row-by-row form's ("direct") at random points, under
both frame parametrisations, with and without covariates or H4's document intercept, and a
compiled model refits a design with another number of cells through ``with_data``.
"""

import numpy as np
import pandas as pd
import pytensor
import pytensor.tensor as pt
import pytest

from fear_assets.models.primary_model import Fitter, Priors, build_model, posterior_draws, prepare
from fear_assets.models.primary_model import primary_cells
from fear_assets_tests.test_primary_model import LEVELS, simulate


def _data(covariates=True, seed=0, frames=6):
    data = simulate({"self": 0.4, "peer": 0.0, "person": 0.1}, frames=frames, seed=seed)
    return prepare(data, LEVELS) if covariates else prepare(data, LEVELS, covariates=())


def test_the_cells_rebuild_the_design_exactly():
    d = _data()
    c = primary_cells(d)
    assert len(c.X_cells) < len(d.X) and len(c.Z_patterns) < len(d.Z)  # something to compress
    rebuilt = c.X_cells[c.cell]
    rebuilt[:, list(c.covariate_columns)] = c.X_covariates
    np.testing.assert_array_equal(rebuilt, d.X)
    assert [d.names[i] for i in c.covariate_columns] == list(d.covariates)
    effects = np.random.default_rng(1).normal(size=(d.n_frames, d.Z.shape[1]))
    np.testing.assert_allclose((effects @ c.Z_patterns.T).ravel()[c.frame_pattern],
                               (d.Z * effects[d.frame]).sum(axis=1), rtol=1e-12, atol=1e-12)
    again = primary_cells(d)
    assert all(np.array_equal(getattr(c, f), getattr(again, f)) for f in ("X_cells", "cell", "frame_pattern"))


def _density(model):
    logp = model.logp()
    return pytensor.function(model.value_vars, [logp, *pt.grad(logp, model.value_vars)])


@pytest.mark.parametrize("frames", ["non_centred", "centred"])
@pytest.mark.parametrize("variant", ["registered", "no covariates", "document"])
def test_cells_and_direct_give_the_same_log_density_and_gradient(settings, frames, variant):
    priors = Priors.from_settings(settings)
    if variant == "document":
        data = simulate({"self": 0.4, "peer": 0.0, "person": 0.1}, frames=4, seed=2)
        data["document"] = data["frame"] + "|" + data["depth"]
        d = prepare(data, LEVELS, document="document")
    else:
        d = _data(covariates=variant == "registered")
    cells, direct = (build_model(d, priors, frames=frames, predictor=p) for p in ("cells", "direct"))
    assert [v.name for v in cells.value_vars] == [v.name for v in direct.value_vars]
    f_cells, f_direct = _density(cells), _density(direct)
    rng = np.random.default_rng(3)
    point = direct.initial_point()
    for _ in range(3):
        args = [point[v.name] + 0.3 * rng.standard_normal(np.shape(point[v.name])) for v in direct.value_vars]
        for a, b in zip(f_cells(*args), f_direct(*args)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_a_wrong_gather_is_caught():
    """The comparison above can fail: frame effects gathered with the slope patterns of
    another frame give another mu."""
    d = _data()
    c = primary_cells(d)
    effects = np.random.default_rng(1).normal(size=(d.n_frames, d.Z.shape[1]))
    shifted = (c.frame_pattern + len(c.Z_patterns)) % (d.n_frames * len(c.Z_patterns))
    assert not np.allclose((effects @ c.Z_patterns.T).ravel()[shifted], (d.Z * effects[d.frame]).sum(axis=1))


def test_a_compiled_model_refits_a_design_with_other_cells(settings):
    """The cells are data: a design with a cell fewer (one trial type missing in one frame) goes
    through the compiled model and gives the draws of a fresh compile on the same seed."""
    a = _data(seed=4)
    data = simulate({"self": -0.4, "peer": 0.0, "person": 0.0}, frames=6, seed=5)
    drop = (data.frame == "F2") & (data.unit == "F2|r3|o2|d2") & (data.agent == "self") & (data.content == "threat")
    b = prepare(data[~drop].reset_index(drop=True), LEVELS)
    assert len(primary_cells(b).X_cells) == len(primary_cells(a).X_cells) - 1
    priors = Priors.from_settings(settings)
    shared = Fitter(priors, draws=30, tune=30, chains=2, cache=[])
    shared.fit(a, seed=5)
    swapped = shared.fit(b, seed=5)
    fresh = Fitter(priors, draws=30, tune=30, chains=2, cache=[]).fit(b, seed=5)
    assert shared.compilations == 1
    np.testing.assert_allclose(posterior_draws(swapped, "beta"), posterior_draws(fresh, "beta"), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("per_block_sigma", [True, False])
def test_the_joint_model_gives_the_same_log_density_and_gradient(settings, per_block_sigma):
    """The two-block model (gate (c)'s readers, the controls' conditions) evaluates [X | W] per
    distinct row the same way."""
    from fear_assets.models.joint import build_joint_model, joint_cells, prepare_joint

    data = simulate({"self": 0.4, "peer": 0.0, "person": 0.1}, frames=6, seed=6)  # frames 0 and 5 share a fear
    data = pd.concat([data.assign(reader="tested"), data.assign(reader="judge", delta=data.delta * 0.8)],
                     ignore_index=True)
    d = prepare_joint(data, LEVELS, "reader", ("tested", "judge"), 0.5, per_block_sigma, outcome="delta")
    c = joint_cells(d)
    assert len(c.X_cells) < len(d.X)
    priors = Priors.from_settings(settings)
    cells, direct = (build_joint_model(d, priors, predictor=p) for p in ("cells", "direct"))
    f_cells, f_direct = _density(cells), _density(direct)
    rng = np.random.default_rng(7)
    point = direct.initial_point()
    args = [point[v.name] + 0.3 * rng.standard_normal(np.shape(point[v.name])) for v in direct.value_vars]
    for a, b in zip(f_cells(*args), f_direct(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
