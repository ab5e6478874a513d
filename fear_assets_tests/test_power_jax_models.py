"""Every simulated model on the accelerator path comes from PyMC's own graph (issue 28, item 1):
for each block of a simulated dataset (primary H1-H3 in both frame forms, gates (a), (b) and
(c), the four controls, H4, H5), the JAX log density of (parameters, outcome) that
``vectorised.jaxified_logdensity`` makes of the registered model equals PyMC's compiled
``logp``/``dlogp`` within 1e-9 (float64) at random points, for the dataset the model was built
with and, through the outcome input alone, for another dataset of the same design. A tiny
design (5 frames, one depth) keeps it to seconds a model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fear_assets.models.h5_model import H5Priors
from fear_assets.models.primary_model import BUILDERS, Priors
from fear_assets.simulation.blocks import outcome, simulate_blocks
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import PRIMARY_MODEL_BLOCKS, PilotEstimates
from fear_assets.simulation.runner import Rules
from fear_assets.simulation.vectorised import check_logdensity, jaxified_logdensity

TOL = 1e-9


def estimates() -> PilotEstimates:
    """Pilot estimates with every block's (H4's, H5's, the judge's, all four controls)."""
    corr = np.eye(6)
    corr[0, 3] = corr[3, 0] = 0.3
    h5 = {"criterion_intercept": 0.0, "position": 0.1, "criterion_frame_sd": 0.2, "dprime": 1.0,
          "dprime_frame_sd": [0.2] * 6}
    base = PilotEstimates(-0.3, {"depth[d1]": 0.02}, (0.15, 0.05, 0.05, 0.08, 0.03, 0.03), tuple(map(tuple, corr)),
                          0.1, 0.05, 8.0, (0.2, 0.2), {})
    h4 = {**replace(base, sigma=0.1).as_dict(), "document_sd": 0.1}
    controls = {"instructed_interaction": 0.3, "instructed_priority": 0.3, "marked_priority": 0.3,
                "addressee_name": 0.3}
    return PilotEstimates(base.intercept, base.beta, base.frame_sd, base.frame_corr, base.unit_sd, base.sigma,
                          base.nu, base.covariate_sd, controls, h4, h5, 0.08)


@pytest.fixture(scope="module")
def simulated(settings):
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    rules = Rules.from_settings(settings)
    priors = Priors.from_settings(settings)
    two = [simulate_blocks(design, estimates(), rules, "f", "meaningful", i, settings.master_seed,
                           tuple(PRIMARY_MODEL_BLOCKS), priors.fixed_sd) for i in (0, 1)]
    return two, priors, H5Priors.from_settings(settings)


#: The primary model and the probit (its JAX erfcx) in the default run; the joint two-block
#: models and the other blocks compile further PyTensor graphs (10-60 s each on
#: 2 cores), so they run with -m slow.
DEFAULT = ("primary", "forced_choice")
CASES = [pytest.param(c, marks=() if c in DEFAULT else pytest.mark.slow)
         for c in (*PRIMARY_MODEL_BLOCKS, "primary:centred")]


@pytest.mark.parametrize("case", CASES)
def test_jax_log_density_and_gradient_equal_pymcs(simulated, case):
    import jax
    import jax.numpy as jnp

    (first, second), priors, h5_priors = simulated
    block = case.split(":")[0]
    a, b = first[block], second[block]
    if case == "primary:centred":
        build = lambda blk: BUILDERS[("centred", "cells")](blk.data, priors)  # noqa: E731
    else:
        build = lambda blk: blk.build(priors, h5_priors)  # noqa: E731
    model = build(a)
    jm = jaxified_logdensity(model)
    assert len(jm.observed) == 1 and jm.rows == [len(a.data.y)]
    np.testing.assert_array_equal(jm.y0, outcome(a))
    points = jm.x0 + np.random.default_rng(11).normal(0.0, 0.4, (3, jm.dim))
    same = check_logdensity(model, jm, points)
    assert same["logp_rel"] < TOL and same["dlogp_rel"] < TOL, same
    # Another dataset of the design goes through the outcome input alone: the same value and
    # gradient as the graph of a model built on that dataset (whose own equality with PyMC's
    # compiled logp is the check above), and not the first dataset's.
    assert not np.array_equal(outcome(a), outcome(b))
    jb = jaxified_logdensity(build(b))
    vg = lambda f, y: jax.vmap(jax.value_and_grad(lambda x: f(x, jnp.asarray(y))))(jnp.asarray(points))  # noqa: E731
    (va, ga), (vb, gb), (v0, _) = vg(jm.logdensity, outcome(b)), vg(jb.logdensity, outcome(b)), vg(jm.logdensity, outcome(a))
    np.testing.assert_allclose(np.asarray(va), np.asarray(vb), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(gb), rtol=1e-10, atol=1e-10)
    assert np.max(np.abs(np.asarray(v0) - np.asarray(va))) > 1e-3
