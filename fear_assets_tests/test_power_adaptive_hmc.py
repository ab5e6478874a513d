"""The accelerator path's candidate sampler with every dataset's own warm-up (issue 28:
``vectorised.BatchedAdaptiveHMC``): datasets whose posteriors differ by orders of magnitude in
scale, fitted in one program, each get their own step size, mass matrix and trajectory length
and recover their known posterior; the extension continues the same chains; Stan's window
schedule has its shape."""

from __future__ import annotations

import numpy as np
import pytest

from fear_assets.simulation import diagnostics as dg
from fear_assets.simulation.vectorised import stan_windows

SHAPE = np.array([1.0, 0.2, 3.0])  # within a dataset: an anisotropic target (the mass matrix must learn it)


def _gaussian(x, y):
    """Dataset y = (mean (3), log scale): log N(x; mean, (exp(log scale) * SHAPE)^2), known exactly."""
    import jax.numpy as jnp

    scale = SHAPE * jnp.exp(y[3])
    return -0.5 * (((x - y[:3]) / scale) ** 2).sum()


#: Three datasets 80 times apart in scale: one frozen step size cannot serve them all.
Y = np.array([[0.0, 0.0, 0.0, np.log(0.05)], [1.0, -2.0, 5.0, 0.0], [-0.5, 3.0, -4.0, np.log(4.0)]])


@pytest.fixture(scope="module")
def adaptive_fit():
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC

    sampler = BatchedAdaptiveHMC(_gaussian, 3, np.zeros(3), target_accept=0.8)
    start = FrozenHMC(0.1, 0.5, np.ones(3), np.random.default_rng(3).uniform(-1, 1, (4, 3)))
    fits = [sampler.fit_kept(Y, start, seed=5, warmup=300, draws=1000) for _ in range(2)]
    extended = sampler.extend(Y, fits[0], seed=6, draws=200)
    return fits, extended


def test_each_dataset_adapts_its_own_kernel_and_recovers_its_posterior(adaptive_fit):
    (fit, _), _ = adaptive_fit
    scales = np.exp(Y[:, 3])[:, None] * SHAPE
    ad = fit["adapted"]
    # each dataset's mass matrix is its own posterior variance (Stan's windows), within a factor 2
    np.testing.assert_allclose(ad.inverse_mass_matrix / scales ** 2, 1.0, rtol=0.6)
    # in whitened units the kernels agree: step sizes and lengths scale with each dataset's posterior
    assert ad.step_size.max() / ad.step_size.min() < 3
    # ChEES lengthens the trajectory beyond a few leapfrog steps (a sign error shrinks it to one)
    assert np.all(ad.trajectory_length / ad.step_size > 3), ad.trajectory_length / ad.step_size
    kept = fit["kept"]
    assert kept.shape == (3, 4, 1000, 3)
    for k in range(3):
        for j in range(3):
            x = kept[k, :, :, j]
            assert abs(x.mean() - Y[k, j]) / dg.mcse_mean(x) < 4.5, (k, j)
            assert abs(x.std(ddof=1) - scales[k, j]) / dg.mcse_sd(x) < 4.5, (k, j)
            assert dg.rhat(x) < 1.01 and dg.ess_bulk(x) > 400, (k, j)
    assert fit["divergences"].sum() == 0


def test_the_same_seed_gives_the_same_draws(adaptive_fit):
    (a, b), _ = adaptive_fit
    assert a["kept"].tobytes() == b["kept"].tobytes()


def test_an_extension_continues_every_chain_with_its_adapted_kernel(adaptive_fit):
    (fit, _), ext = adaptive_fit
    assert ext["kept"].shape == (3, 4, 1200, 3)
    assert ext["kept"][:, :, :1000].tobytes() == fit["kept"].tobytes()
    # the continued draws are of the same posterior (no warm-up: the kernel is the adapted one)
    for k in range(3):
        tail = ext["kept"][k, :, 1000:, 0]
        assert abs(tail.mean() - Y[k, 0]) / dg.mcse_mean(tail) < 4.5
    assert ext["gradients"][0, 0] > fit["gradients"][0, 0]


@pytest.mark.parametrize("steps", [0, 19, 100, 200, 400, 1000])
def test_stan_windows_have_slow_windows_between_fast_buffers(steps):
    slow, end = stan_windows(steps)
    assert slow.shape == end.shape == (steps,)
    if steps < 20:
        assert not slow.any() and not end.any()
        return
    first, last = np.flatnonzero(slow)[[0, -1]]
    assert first > 0 and last < steps - 1  # a fast buffer on each side
    assert slow[first:last + 1].all()  # the slow windows are contiguous
    assert end[last] and end.sum() >= 1 and not end[~slow].any()
    if steps == 1000:  # Stan's defaults: 75 fast, windows 25, 50, 100, 200, 500 (the last absorbs the rest), 50 fast
        assert first == 75 and last == 949 and list(np.flatnonzero(end)) == [99, 149, 249, 449, 949]
