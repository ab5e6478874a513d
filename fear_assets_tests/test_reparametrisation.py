"""D3b: the reparametrisations that make the samplers mix leave the joint prior as stated.

The primary model and the H5 probit draw their frame effects non-centred (z @ chol.T with an
LKJ Cholesky factor) and their scalar random intercepts as sd * z. Prior draws of the models
as implemented are compared with draws from explicitly centred reference models built from
the registered priors (MvNormal(0, chol), Normal(0, sd)): every coordinate, pairwise products
within a frame (the correlations) and products across frames or units (the shared scale)
must agree by a two-sample KS test. A deliberately wrong form (z @ chol, the transpose) is
shown to fail, so the comparison has the power to catch a mistake. The fixed-effect prior
sd is read off the built graph and must equal the registered value.
"""

from itertools import combinations

import numpy as np
import pymc as pm
from scipy.stats import ks_2samp

from fear_assets.models.h5_model import H5Priors, build_h5_model, prepare_h5
from fear_assets.models.primary_model import Priors, build_model, prepare
from fear_assets_tests.test_h5_model import CELLS
from fear_assets_tests.test_h5_model import simulate as simulate_h5
from fear_assets_tests.test_primary_model import LEVELS, simulate

DRAWS = 4000
P_MIN = 0.001


def _statistics(effects: np.ndarray) -> dict[str, np.ndarray]:
    """draws x frames x k: each coordinate of frame 0, the products of every pair within frame
    0, and frame 0 x frame 1 for each coordinate."""
    out = {f"e[{i}]": effects[:, 0, i] for i in range(effects.shape[2])}
    out.update({f"e[{i}]*e[{j}]": effects[:, 0, i] * effects[:, 0, j]
                for i, j in combinations(range(effects.shape[2]), 2)})
    out.update({f"e0[{i}]*e1[{i}]": effects[:, 0, i] * effects[:, 1, i] for i in range(effects.shape[2])})
    return out


def _disagreements(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    p = {name: ks_2samp(a[name], b[name]).pvalue for name in a}
    return {name: value for name, value in p.items() if value <= P_MIN}


def _centred_frames(n_frames: int, k: int, eta: float, group_sd: float, seed: int) -> np.ndarray:
    with pm.Model():
        chol, _, _ = pm.LKJCholeskyCov("chol", n=k, eta=eta, sd_dist=pm.HalfNormal.dist(group_sd),
                                       compute_corr=True)
        effects = pm.MvNormal("effects", mu=np.zeros(k), chol=chol, shape=(n_frames, k))
    return pm.draw(effects, draws=DRAWS, random_seed=seed)


def _centred_intercepts(n: int, group_sd: float, seed: int) -> np.ndarray:
    with pm.Model():
        sd = pm.HalfNormal("sd", group_sd)
        effects = pm.Normal("effects", 0.0, sd, shape=n)
    return pm.draw(effects, draws=DRAWS, random_seed=seed)


def _pair_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"u[0]": x[:, 0], "u[0]*u[1]": x[:, 0] * x[:, 1], "u[0]^2": x[:, 0] ** 2}


def _normal_sd(var) -> float:
    """The sigma a Normal prior was built with, read off the graph (rng, size, mu, sigma)."""
    return float(np.unique(var.owner.inputs[-1].eval()).item())


def test_primary_model_prior_is_unchanged_by_non_centring(settings):
    priors = Priors.from_settings(settings)
    d = prepare(simulate({"self": 0.0, "peer": 0.0, "person": 0.0}, frames=2), LEVELS)
    model = build_model(d, priors)
    frames, z, packed, unit = pm.draw([model["frame_effects"], model["z_frame"], model["frame_chol"],
                                     model["unit_sd"][..., None] * model["z_unit"]], draws=DRAWS, random_seed=11)
    reference = _centred_frames(d.n_frames, 6, priors.lkj_eta, priors.group_sd, seed=12)
    assert _disagreements(_statistics(frames), _statistics(reference)) == {}
    chol = np.zeros((DRAWS, 6, 6))
    chol[:, *np.tril_indices(6)] = packed  # LKJCholeskyCov's packed lower triangle, row by row
    np.testing.assert_allclose(frames, z @ np.swapaxes(chol, 1, 2), atol=1e-10)  # the implemented form
    wrong = z @ chol  # covariance chol.T @ chol, not the stated chol @ chol.T
    assert _disagreements(_statistics(wrong), _statistics(reference))
    assert _disagreements(_pair_stats(unit), _pair_stats(_centred_intercepts(d.n_units, priors.group_sd, 13))) == {}
    registered = settings.priors
    assert _normal_sd(model["beta"]) == registered.fixed_effect_sd == 0.5
    assert _normal_sd(model["intercept"]) == registered.intercept_sd
    beta = pm.draw(model["beta"], draws=DRAWS, random_seed=14)
    assert abs(beta.std() - 0.5) < 0.01


def test_primary_model_prior_is_unchanged_by_centring_on_the_fixed_effects(settings):
    """D3b: the centred form (each frame's effects drawn around the fixed effects they vary
    about, benchmarks/reparam.py) gives the registered prior: frame effects MvNormal(0, chol)
    independent of the fixed effects, the fixed effects Normal(0, 0.5)."""
    from fear_assets.models.primary_model import frame_centring

    priors = Priors.from_settings(settings)
    d = prepare(simulate({"self": 0.0, "peer": 0.0, "person": 0.0}, frames=5), LEVELS)  # every fear class
    centring = frame_centring(d.X, d.Z, d.frame, d.n_frames)
    fear = [i for i, n in enumerate(d.names) if n.startswith("fear[")]
    assert centring.slopes[0] is None and None not in centring.slopes[1:]  # five slopes on their fixed effects
    assert [d.names[c] for c in centring.slopes[1:]] == ["agent[self]", "agent[peer]", "content[threat]",
                                                          "agent[self]:content[threat]", "agent[peer]:content[threat]"]
    assert list(centring.level_columns) == fear  # the frame intercept on intercept + fear class
    model = build_model(d, priors, frames="centred")
    assert "z_frame" not in model.named_vars and "frame_centred" in model.named_vars
    frames, centred, beta, intercept = pm.draw([model["frame_effects"], model["frame_centred"], model["beta"],
                                                model["intercept"]], draws=DRAWS, random_seed=31)
    reference = _centred_frames(d.n_frames, 6, priors.lkj_eta, priors.group_sd, seed=32)
    assert _disagreements(_statistics(frames), _statistics(reference)) == {}
    # The implemented form: frame_effects = frame_centred - means(intercept, beta).
    means = np.stack([intercept[:, None] + beta[:, fear] @ centring.levels.T]
                     + [np.repeat(beta[:, [c]], d.n_frames, axis=1) for c in centring.slopes[1:]], axis=2)
    np.testing.assert_allclose(frames, centred - means, atol=1e-10)
    assert _disagreements(_statistics(centred), _statistics(reference))  # the test can tell a wrong form
    # Independent of the fixed effects, as in the non-centred form.
    nc = build_model(d, priors)
    nc_frames, nc_beta, nc_intercept = pm.draw([nc["frame_effects"], nc["beta"], nc["intercept"]], draws=DRAWS,
                                               random_seed=33)
    products = lambda f, b, i: {"f0*intercept": f[:, 0, 0] * i, "f0*fear": f[:, 0, 0] * b[:, fear[0]],  # noqa: E731
                                "f1*agent": f[:, 0, 1] * b[:, centring.slopes[1]]}
    assert _disagreements(products(frames, beta, intercept), products(nc_frames, nc_beta, nc_intercept)) == {}
    assert _normal_sd(model["beta"]) == 0.5 and abs(beta.std() - 0.5) < 0.01
    assert _normal_sd(model["intercept"]) == priors.intercept_sd


def test_h5_prior_is_unchanged_by_non_centring(settings):
    priors = H5Priors.from_settings(settings)
    d = prepare_h5(simulate_h5(frames=2, trials=4, removed=2), CELLS)
    model = build_h5_model(d, priors)
    frames, criterion = pm.draw([model["dprime_frame"], model["criterion_frame"]], draws=DRAWS, random_seed=21)
    reference = _centred_frames(d.n_frames, len(CELLS), priors.lkj_eta, priors.group_sd, seed=22)
    assert _disagreements(_statistics(frames), _statistics(reference)) == {}
    reference_criterion = _centred_intercepts(d.n_frames, priors.group_sd, seed=23)
    assert _disagreements(_pair_stats(criterion), _pair_stats(reference_criterion)) == {}
    h5_sd = settings.priors.h5_probit_fixed_sd
    for name in ("dprime", "criterion_beta", "criterion_intercept"):
        assert _normal_sd(model[name]) == h5_sd
