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


def test_a_pooled_length_is_one_trajectory_length_for_the_batch_and_each_dataset_keeps_its_own_kernel():
    """``pool_length``: the ChEES criterion averaged over every dataset gives the batch ONE
    trajectory length (in each dataset's whitened units), while step sizes and mass matrices
    stay per dataset; every dataset, 80 times apart in scale, still recovers its posterior."""
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC

    start = FrozenHMC(0.1, 0.5, np.ones(3), np.random.default_rng(3).uniform(-1, 1, (4, 3)))
    own = BatchedAdaptiveHMC(_gaussian, 3, np.zeros(3), target_accept=0.8).fit_kept(Y, start, seed=5, warmup=300,
                                                                                    draws=1000)
    fit = BatchedAdaptiveHMC(_gaussian, 3, np.zeros(3), target_accept=0.8, pool_length=True).fit_kept(
        Y, start, seed=5, warmup=300, draws=1000)
    ad, ad_own = fit["adapted"], own["adapted"]
    assert np.ptp(ad.trajectory_length) == 0.0, ad.trajectory_length
    assert np.ptp(ad_own.trajectory_length) > 0.0  # without pooling each dataset has its own
    # ChEES still lengthens the shared trajectory beyond a few leapfrog steps
    assert np.all(ad.trajectory_length / ad.step_size > 3), ad.trajectory_length / ad.step_size
    scales = np.exp(Y[:, 3])[:, None] * SHAPE
    np.testing.assert_allclose(ad.inverse_mass_matrix / scales ** 2, 1.0, rtol=0.6)
    assert ad.step_size.max() / ad.step_size.min() < 3  # per dataset, in whitened units
    assert fit["divergences"].sum() == 0
    for k in range(3):
        for j in range(3):
            x = fit["kept"][k, :, :, j]
            assert abs(x.mean() - Y[k, j]) / dg.mcse_mean(x) < 4.5, (k, j)
            assert abs(x.std(ddof=1) - scales[k, j]) / dg.mcse_sd(x) < 4.5, (k, j)
            assert dg.rhat(x) < 1.01 and dg.ess_bulk(x) > 400, (k, j)


#: Posterior SDs from 1e-4 to 1: the cold start (+-0.5 about 0) is thousands of SDs out in the
#: narrow directions, as at registered size.
NARROW_TO_WIDE = np.logspace(-4, 0, 200)


def _wide_and_narrow(x, y):
    """N(y, diag(NARROW_TO_WIDE^2))."""
    return -0.5 * (((x - y) / NARROW_TO_WIDE) ** 2).sum()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_pooled_length_survives_the_cold_starts_transient(seed, settings):
    """From the cold start, the first transitions are rejected and the step size crashes, which
    cuts the length to max_steps x eps, while the transient's ChEES gradients (1e5 at registered
    size) would fill Adam's memory for the whole warm-up. A registered-size pair of datasets ended
    its warm-up that way (length 0.65 against about 10, bulk ESS 8 after both extensions): the
    length adapts from the first slow window on, the first fit's bulk ESS is the registered one,
    and after the registered remedy (as the product fits it) this batch of two meets the
    registered rule. R-hat at 4 x 500 draws exceeds 1.01 on about 5% of this posterior's
    well-mixed coordinates, which is what the remedy's extensions are for."""
    from fear_assets.simulation.validation import convergence_counts
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC, extend_missing

    Y = np.random.default_rng(1).normal(0.0, 0.1, (2, NARROW_TO_WIDE.size)) * NARROW_TO_WIDE
    sampler = BatchedAdaptiveHMC(_wide_and_narrow, NARROW_TO_WIDE.size, np.zeros(NARROW_TO_WIDE.size),
                                 target_accept=0.9, pool_length=True)
    fit = sampler.fit_kept(Y, FrozenHMC.cold_start(np.zeros(NARROW_TO_WIDE.size), 4, seed), seed + 1, warmup=400,
                           draws=500)
    ad = fit["adapted"]
    assert np.all(ad.trajectory_length / ad.step_size > 50), (ad.trajectory_length, ad.step_size)
    reported = {"narrowest": 0, "middle": NARROW_TO_WIDE.size // 2, "widest": NARROW_TO_WIDE.size - 1}
    rule, remedy = settings.convergence, settings.fitting.convergence_remedy
    for k in range(2):
        for j in reported.values():
            x = fit["kept"][k, :, :, j]
            assert dg.ess_bulk(x) > rule.ess_bulk_min, (k, j, dg.ess_bulk(x))
            assert abs(x.mean() - Y[k, j]) / dg.mcse_mean(x) < 4.5, (k, j)
    assert fit["divergences"].sum() == 0
    remedied = extend_missing(sampler, Y, fit, lambda kept: {c: kept[..., j] for c, j in reported.items()},
                              lambda draws, div: convergence_counts(draws, rule, div)["failing"], seed + 2,
                              settings.simulation_sampler.extension_draws, remedy.max_extensions)
    counts = convergence_counts(remedied.draws, rule, remedied.divergences)
    assert not np.any(counts["failing"]), (counts, remedied.extended)


def test_a_lone_pooled_dataset_warms_up_on_helper_chains_and_samples_with_its_own(settings):
    """A pooled program of fewer than ``min_pooled_chains`` chains (a lone frame form, a refit of
    one dataset) rests its step size, metric and length on that many chains of its own dataset:
    at the registered size one dataset's 4 chains alone ended the warm-up with a twenty-fifth of
    the length. Simulated on a 200-coordinate posterior with SDs from 1e-4 to 1: with the floor,
    the warm-up's helper chains estimate the metric better (so the step size is larger), and the
    draws are still the registered chains' only, of the right posterior."""
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC

    registered = settings.simulation_sampler.min_pooled_chains
    Y = np.random.default_rng(1).normal(0.0, 0.1, (1, NARROW_TO_WIDE.size)) * NARROW_TO_WIDE
    fits = {}
    for floor in (0, registered):
        sampler = BatchedAdaptiveHMC(_wide_and_narrow, NARROW_TO_WIDE.size, np.zeros(NARROW_TO_WIDE.size),
                                     target_accept=0.9, pool_length=True, min_pooled_chains=floor)
        assert sampler.warmup_chains(1, 4) == max(4, floor)
        fits[floor] = sampler.fit_kept(Y, FrozenHMC.cold_start(np.zeros(NARROW_TO_WIDE.size), 4, 0), 1, warmup=400,
                                       draws=500)
    alone, helped = fits[0], fits[registered]
    for fit in (alone, helped):  # the registered chains only, whatever the warm-up ran
        assert fit["kept"].shape == (1, 4, 500, NARROW_TO_WIDE.size)
        assert fit["positions"].shape == (1, 4, NARROW_TO_WIDE.size) and fit["warmup_divergences"].shape == (1, 4)
        assert fit["gradients"].shape == fit["divergences"].shape == (1, 4)

    def metric_error(fit):  # RMS log ratio of the adapted inverse metric to the posterior variances
        return float(np.sqrt(np.mean(np.log(fit["adapted"].inverse_mass_matrix[0] / NARROW_TO_WIDE ** 2) ** 2)))

    assert metric_error(helped) < 0.8 * metric_error(alone), (metric_error(helped), metric_error(alone))
    assert helped["adapted"].step_size[0] > 1.5 * alone["adapted"].step_size[0]
    for j in range(0, NARROW_TO_WIDE.size, 20):
        x = helped["kept"][0, :, :, j]
        assert dg.rhat(x) < 1.01 and abs(x.mean() - Y[0, j]) / dg.mcse_mean(x) < 4.5, (j, dg.rhat(x))
    assert helped["divergences"].sum() == 0
    # an extension continues the registered chains with the adapted kernel
    sampler = BatchedAdaptiveHMC(_wide_and_narrow, NARROW_TO_WIDE.size, np.zeros(NARROW_TO_WIDE.size),
                                 target_accept=0.9, pool_length=True)
    assert sampler.extend(Y, helped, seed=2, draws=50)["kept"].shape == (1, 4, 550, NARROW_TO_WIDE.size)


def test_the_floor_leaves_a_pooled_batch_of_enough_chains_as_it_was():
    """Batches pooling at least ``min_pooled_chains`` chains run exactly as without the floor
    (the registered-size runs of six datasets are reproduced bit for bit); a smaller one changes."""
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC

    six = np.concatenate([Y, Y + 0.5])
    start = FrozenHMC(0.1, 0.5, np.ones(3), np.random.default_rng(3).uniform(-1, 1, (4, 3)))

    def fit(y, floor):
        return BatchedAdaptiveHMC(_gaussian, 3, np.zeros(3), target_accept=0.8, pool_length=True,
                                  min_pooled_chains=floor).fit_kept(y, start, seed=5, warmup=150, draws=100)["kept"]

    assert fit(six, 24).tobytes() == fit(six, 0).tobytes()
    assert fit(Y[:1], 24).tobytes() != fit(Y[:1], 0).tobytes()
    with pytest.raises(ValueError, match="min_pooled_chains"):
        BatchedAdaptiveHMC(_gaussian, 3, np.zeros(3), pool_length=True, min_pooled_chains=-1)


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


# -- the block mass matrix: dense on the global parameters, diagonal on the unit intercepts ----------
G, U = 4, 12  # 4 "global" coordinates, strongly correlated; 12 independent "unit intercepts"
_RHO = 0.95
_SD_G = np.array([1.0, 0.1, 5.0, 2.0])
COV_G = _SD_G[:, None] * (np.full((G, G), _RHO) + (1 - _RHO) * np.eye(G)) * _SD_G[None, :]
UNIT_SD = np.geomspace(0.05, 3.0, U)


def _correlated(x, y):
    """Dataset y = (mean (G + U), log scale): globals N(mean, s^2 COV_G), unit coordinates
    N(mean, (s UNIT_SD)^2) independent of them; a diagonal metric can whiten only the units."""
    import jax.numpy as jnp

    d = (x - y[:-1]) / jnp.exp(y[-1])
    g, u = d[:G], d[G:]
    return -0.5 * (g @ jnp.asarray(np.linalg.inv(COV_G)) @ g + ((u / UNIT_SD) ** 2).sum())


#: Two datasets, 10 times apart in scale, with their own means.
Y_CORR = np.concatenate([np.random.default_rng(2).normal(size=(2, G + U)) * 3, np.log([[1.0], [0.1]])], axis=1)


@pytest.fixture(scope="module")
def dense_and_diagonal():
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, FrozenHMC

    start = FrozenHMC(0.1, 0.5, np.ones(G + U), np.random.default_rng(3).uniform(-1, 1, (4, G + U)))
    out = {}
    for name, dense in (("dense", np.arange(G)), ("diagonal", None)):
        sampler = BatchedAdaptiveHMC(_correlated, G + U, np.zeros(G + U), target_accept=0.8, dense_idx=dense)
        fit = sampler.fit_kept(Y_CORR, start, seed=5, warmup=400, draws=500)
        out[name] = (sampler, fit)
    out["extended"] = out["dense"][0].extend(Y_CORR, out["dense"][1], seed=6, draws=200)
    return out


def _min_ess(kept, coords):
    return np.array([[dg.ess_bulk(kept[k, :, :, j]) for j in coords] for k in range(len(kept))]).min(axis=1)


def test_the_dense_block_learns_each_datasets_global_covariance(dense_and_diagonal):
    _, fit = dense_and_diagonal["dense"]
    ad = fit["adapted"]
    assert list(ad.dense_idx) == list(range(G)) and ad.dense_chol.shape == (2, G, G)
    for k in range(2):
        true = COV_G * np.exp(2 * Y_CORR[k, -1])
        Li = np.linalg.inv(np.linalg.cholesky(true))
        # whitened by the true block, the adapted block is near the identity (a diagonal one has
        # eigenvalues 1 / eig(correlation): 0.26 and 20 here)
        eig = np.linalg.eigvalsh(Li @ ad.dense_block()[k] @ Li.T)
        assert eig.min() > 0.4 and eig.max() < 2.5, (k, eig)
    # the unit intercepts stay on a diagonal: each its own posterior variance
    unit_var = UNIT_SD ** 2 * np.exp(2 * Y_CORR[:, -1:])
    np.testing.assert_allclose(ad.inverse_mass_matrix[:, G:] / unit_var, 1.0, rtol=0.6)


def test_the_dense_block_beats_the_diagonal_on_a_correlated_target(dense_and_diagonal):
    _, dense = dense_and_diagonal["dense"]
    _, diag = dense_and_diagonal["diagonal"]
    # the whitened target is round: the step size is not held down by the thin direction
    assert np.all(dense["adapted"].step_size > 2 * diag["adapted"].step_size), (
        dense["adapted"].step_size, diag["adapted"].step_size)
    assert diag["adapted"].dense_chol is None
    # and the global coordinates mix better for the same number of draws
    assert _min_ess(dense["kept"], range(G)).min() > 1.2 * _min_ess(diag["kept"], range(G)).min()


def test_the_dense_fit_recovers_the_correlated_posterior(dense_and_diagonal):
    _, fit = dense_and_diagonal["dense"]
    kept = fit["kept"]
    assert fit["divergences"].sum() == 0
    for k in range(2):
        s = np.exp(Y_CORR[k, -1])
        sd = np.concatenate([np.sqrt(np.diag(COV_G)), UNIT_SD]) * s
        for j in range(G + U):
            x = kept[k, :, :, j]
            assert abs(x.mean() - Y_CORR[k, j]) / dg.mcse_mean(x) < 4.5, (k, j)
            assert abs(x.std(ddof=1) - sd[j]) / dg.mcse_sd(x) < 4.5, (k, j)
            # 1.02, not the rule's 1.01: at 4 x 500 draws of a mixing chain R-hat itself varies by ~0.005
            assert dg.rhat(x) < 1.02 and dg.ess_bulk(x) > 400, (k, j)
        flat = kept[k].reshape(-1, G + U)
        assert abs(np.corrcoef(flat[:, 0], flat[:, 2])[0, 1] - _RHO) < 0.02


def test_an_extension_keeps_the_dense_block(dense_and_diagonal):
    _, fit = dense_and_diagonal["dense"]
    ext = dense_and_diagonal["extended"]
    assert ext["kept"].shape == (2, 4, 700, G + U)
    assert ext["kept"][:, :, :500].tobytes() == fit["kept"].tobytes()
    assert ext["divergences"].sum() == 0
    for k in range(2):
        tail = ext["kept"][k, :, 500:, :G]
        assert abs(np.corrcoef(tail[..., 0].ravel(), tail[..., 2].ravel())[0, 1] - _RHO) < 0.03


def test_a_fit_stopped_between_chunks_resumes_with_the_draws_an_unbroken_run_makes(dense_and_diagonal, tmp_path):
    """A long run killed between chunks of draws (a session's or lease's end) continues in
    another process from its checkpoint: the same chains, kernels and draws as had it never
    stopped, to the byte; a checkpoint of another run is refused, not continued."""
    from fear_assets.simulation.vectorised import BatchedAdaptiveHMC, load_fit, save_fit

    _, fit = dense_and_diagonal["dense"]
    path = tmp_path / "primary.fit.npz"
    assert load_fit(path, "run-a") is None  # nothing saved: the run starts afresh
    save_fit(fit, path, "run-a")
    # another process: a new sampler (its programs compiled anew) from the saved fit alone
    fresh = BatchedAdaptiveHMC(_correlated, G + U, np.zeros(G + U), target_accept=0.8, dense_idx=np.arange(G))
    resumed = fresh.extend(Y_CORR, load_fit(path, "run-a"), seed=6, draws=200)
    unbroken = dense_and_diagonal["extended"]
    for k in ("kept", "divergences", "gradients", "positions"):
        assert resumed[k].tobytes() == unbroken[k].tobytes(), k
    np.testing.assert_array_equal(resumed["adapted"].dense_chol, fit["adapted"].dense_chol)
    # a diagonal kernel's checkpoint has no dense block, and loads as one without it
    _, diagonal = dense_and_diagonal["diagonal"]
    save_fit(diagonal, tmp_path / "diagonal.npz", "run-b")
    assert load_fit(tmp_path / "diagonal.npz", "run-b")["adapted"].dense_chol is None
    with pytest.raises(ValueError, match="primary.fit.npz: a checkpoint of another run"):
        load_fit(path, "run-b")
    # a write killed mid-way (its half file written aside) leaves the previous checkpoint whole,
    # and the next write replaces both
    (tmp_path / "primary.fit.npz.part").write_bytes(b"PK\x03\x04 cut short")
    assert load_fit(path, "run-a")["kept"].tobytes() == fit["kept"].tobytes()
    save_fit(resumed, path, "run-a")
    assert not list(tmp_path.glob("*.part"))
    assert load_fit(path, "run-a")["kept"].shape == (2, 4, 700, G + U)


def test_the_block_metric_is_the_block_diagonal_matrix():
    import jax
    import jax.numpy as jnp

    from fear_assets.simulation.vectorised import block_metric, whiten, whiten_momentum

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(9)
    dim, idx = 7, np.array([1, 4, 5])
    A = rng.normal(size=(3, 3))
    block = A @ A.T + 0.5 * np.eye(3)
    diag = rng.uniform(0.2, 3.0, dim)
    full = np.diag(diag)
    full[np.ix_(idx, idx)] = block  # the inverse mass matrix: dense on idx, diagonal elsewhere
    L = np.linalg.cholesky(block)
    metric = block_metric(jnp.asarray(diag), jnp.asarray(L), jnp.asarray(idx))
    p = rng.normal(size=dim)
    assert np.isclose(float(metric.kinetic_energy(jnp.asarray(p))), 0.5 * p @ full @ p)
    np.testing.assert_allclose(np.asarray(jax.grad(metric.kinetic_energy)(jnp.asarray(p))), full @ p, rtol=1e-12)
    # momenta are drawn from N(0, M), M the inverse of that matrix
    draws = jax.vmap(lambda k: metric.sample_momentum(k, jnp.zeros(dim)))(jax.random.split(jax.random.PRNGKey(0), 40000))
    root = np.linalg.cholesky(full)
    white = np.asarray(draws) @ root  # L^T p: covariance I when p ~ N(0, full^-1)
    np.testing.assert_allclose(np.cov(white.T), np.eye(dim), atol=0.04)
    # the whitened frame: x = (block factor) z on the block, sqrt(diag) z elsewhere, maps back to z
    z = rng.normal(size=dim)
    x = np.sqrt(diag) * z
    x[idx] = L @ z[idx]
    np.testing.assert_allclose(np.asarray(whiten(jnp.asarray(x), jnp.asarray(diag), jnp.asarray(L), jnp.asarray(idx))),
                               z, rtol=1e-10)
    v = np.asarray(whiten_momentum(jnp.asarray(p), jnp.asarray(diag), jnp.asarray(L), jnp.asarray(idx)))
    # |whitened velocity|^2 = p^T M^-1 p
    assert np.isclose(v @ v, p @ full @ p)


def test_the_dense_block_is_every_variable_but_the_unit_intercepts():
    from fear_assets.simulation.accelerated import dense_block_indices

    names = ["intercept", "beta", "frame_chol_cholesky-cov-packed__", "z_frame", "unit_sd_log__", "z_unit",
             "sigma_log__", "nu_log__"]
    sizes = [1, 3, 21, 30, 1, 8, 1, 1]
    idx = dense_block_indices(names, sizes)
    offsets = np.cumsum([0] + sizes)
    unit = set(range(offsets[5], offsets[6]))
    assert set(idx) == set(range(offsets[-1])) - unit and len(idx) == offsets[-1] - 8
    with pytest.raises(ValueError):
        dense_block_indices(["z_unit"], [5])


def _equicorrelated_draws(n: int, p: int, seed: int):
    """n draws of a p-dimensional normal with correlation 0.3 between every pair and standard
    deviations spread over two orders of magnitude; returns the draws and the true covariance."""
    sd = np.geomspace(0.01, 1.0, p)
    true = sd[:, None] * (np.full((p, p), 0.3) + 0.7 * np.eye(p)) * sd[None, :]
    return np.random.default_rng(seed).multivariate_normal(np.zeros(p), true, size=n), true


def test_the_dense_blocks_shrinkage_is_scikit_learns_oas_on_the_correlation_matrix():
    import jax
    from sklearn.covariance import oas

    from fear_assets.simulation.vectorised import oas_towards_diagonal

    jax.config.update("jax_enable_x64", True)
    x, _ = _equicorrelated_draws(300, 120, seed=4)
    cov = np.cov(x.T)
    shrunk, rho = oas_towards_diagonal(cov, np.float64(len(x)))
    # scikit-learn's estimator on the standardised draws (its empirical correlation, 1/n)
    z = (x - x.mean(0)) / x.std(0)
    expected_corr, expected_rho = oas(z, assume_centered=True)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(float(rho), expected_rho, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(shrunk), sd[:, None] * expected_corr * sd[None, :], rtol=1e-9, atol=1e-15)
    # the variances are the sample's own: only the correlations shrink
    np.testing.assert_allclose(np.diag(np.asarray(shrunk)), np.diag(cov), rtol=1e-12)


def _factor_posterior(p: int, seed: int):
    """A block like a model's global parameters and frame effects: three shared factors
    correlate many coordinates weakly (correlations up to about 0.3, the largest eigenvalue of
    the correlation about 15), standard deviations over two orders of magnitude."""
    rng = np.random.default_rng(seed)
    loadings = rng.normal(0, 0.25, (p, 3))
    c = np.eye(p) + loadings @ loadings.T
    c = c / np.sqrt(np.outer(np.diag(c), np.diag(c)))
    sd = np.geomspace(0.01, 1.0, p)
    return sd[:, None] * c * sd[None, :]


def test_the_shrunk_dense_block_whitens_a_posterior_that_a_short_window_estimates_badly():
    """The case that slowed the block metric: a window of few draws (400) for a block of many
    coordinates (300). Whitened by the raw sample covariance, the true posterior's eigenvalues
    spread far from 1 (the sample's smallest eigenvalues are too small); by the shrunk one,
    much less, and less than by the diagonal alone (the correlations it keeps matter): the
    spread is what ChEES's trajectory length follows."""
    import jax

    from fear_assets.simulation.vectorised import oas_towards_diagonal

    jax.config.update("jax_enable_x64", True)

    def spread(true, metric):
        li = np.linalg.inv(np.linalg.cholesky(metric))
        eig = np.linalg.eigvalsh(li @ true @ li.T)
        return eig.max() / eig.min()

    for seed in range(3):
        true = _factor_posterior(300, seed)
        x = np.random.default_rng(20 + seed).multivariate_normal(np.zeros(300), true, size=400)
        cov = np.cov(x.T)
        shrunk = np.asarray(oas_towards_diagonal(cov, np.float64(len(x)))[0])
        raw, oas_, diagonal = spread(true, cov), spread(true, shrunk), spread(true, np.diag(np.diag(cov)))
        assert oas_ < raw / 5 and oas_ < diagonal / 2, (seed, raw, oas_, diagonal)


def test_the_remedy_extends_only_the_datasets_that_miss_the_rule_and_keeps_every_dataset(settings):
    """6.1's remedy on the accelerator path: "a dataset whose fit misses the convergence rule on
    any reported contrast is extended (more draws), and after that counted and kept (D7), never
    dropped". Simulated: a batch in which some datasets meet the rule and some miss it (the
    rule's ESS set between them). Only those missing it continue their chains; a dataset that
    meets it keeps its first fit's draws, whichever datasets share its batch; one that never
    meets it is extended the registered number of times and kept."""
    from types import SimpleNamespace

    import jax

    from fear_assets.models.h5_model import H5Priors
    from fear_assets.models.primary_model import Priors
    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation.blocks import outcome, simulate_blocks
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.runner import Rules
    from fear_assets_tests.test_power_jax_models import estimates

    jax.config.update("jax_enable_x64", True)
    priors, h5p = Priors.from_settings(settings), H5Priors.from_settings(settings)
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    blocks = [simulate_blocks(design, estimates(), Rules.from_settings(settings), "remedy", "meaningful", i,
                              settings.master_seed, ("primary", "forced_choice"), priors.fixed_sd)["forced_choice"]
              for i in range(4)]
    prog = acc.block_program(blocks[0], priors, h5p, rule=settings.fitting.frame_parametrisation)
    Y = np.stack([outcome(b) for b in blocks])
    s = SimpleNamespace(algorithm=acc.ADAPTIVE, chains=2, warmup=150, draws=100, extension_draws=60,
                        target_accept=0.8)
    tuned = acc.tune(prog, Y, s, seed=7)
    first = acc.contrast_draws(prog, acc.fit_batch(tuned, Y, 8, s.warmup, s.draws)["kept"])
    ess = np.array([min(dg.ess_bulk(x[k]) for x in first.values()) for k in range(len(Y))])
    low, high = np.sort(ess)[0], np.sort(ess)[-1]
    assert high > low, ess
    rule = SimpleNamespace(rhat_max=10.0, ess_bulk_min=(low + high) / 2, ess_tail_min=0.0, divergences_max=10 ** 6)
    first_fit, fit = acc.fit_with_remedy(prog, tuned, Y, s, 7, rule, extensions=2)
    draws, div, extended = fit.draws, fit.divergences, fit.extended
    missing = ess < rule.ess_bulk_min
    # the gradient evaluations counted per dataset: its extensions' added, the others' its first fit's
    for k in range(len(Y)):
        more = fit.gradients[k] > first_fit["gradients"][k]
        assert more.all() if missing[k] else not more.any(), (k, fit.gradients[k], first_fit["gradients"][k])
    assert extended and extended[0] == missing.sum() and len(div) == len(Y)
    for name, x in first.items():
        for k in range(len(Y)):
            if missing[k]:  # continued: its first draws, then more
                assert draws[name][k].shape[1] > s.draws
                np.testing.assert_array_equal(draws[name][k][:, :s.draws], x[k])
            else:  # met the rule: its first fit's draws, not one more
                np.testing.assert_array_equal(draws[name][k], x[k])
    # a rule no dataset meets: every dataset extended the registered number of times, none dropped
    never = SimpleNamespace(**{**vars(rule), "ess_bulk_min": 1e9})
    _, fit = acc.fit_with_remedy(prog, tuned, Y, s, 7, never, extensions=2)
    draws, div, extended = fit.draws, fit.divergences, fit.extended
    assert extended == [len(Y), len(Y)] and len(div) == len(Y)
    assert all(x.shape == (2, s.draws + 2 * s.extension_draws) for v in draws.values() for x in v)


def test_a_dataset_still_divergent_after_its_extensions_is_refitted_in_the_other_frame_form(settings):
    """The adaptive candidates' remedy beyond the extensions (``accelerated.fit_block``): more
    draws do not cure a divergence, the posterior's geometry in the form the rule picked does;
    D3b lets a reparametrisation that keeps the joint prior make the sampler mix. Simulated: the
    centred form forced on datasets whose frame effects barely vary (the centred funnel: the
    registered zero-divergence rule fails) beside datasets whose frame effects vary widely (the
    centred form's own case). Only the divergent ones are fitted again in the non-centred form,
    and that fit's draws, divergences and form are kept; the others keep their first fit's
    draws exactly."""
    from dataclasses import replace
    from types import SimpleNamespace

    import jax

    from fear_assets.models.h5_model import H5Priors
    from fear_assets.models.primary_model import Priors
    from fear_assets.simulation import accelerated as acc
    from fear_assets.simulation.blocks import outcome, simulate_blocks
    from fear_assets.simulation.design import simulated_design
    from fear_assets.simulation.runner import Rules
    from fear_assets_tests.test_power_jax_models import estimates

    jax.config.update("jax_enable_x64", True)
    priors, h5p = Priors.from_settings(settings), H5Priors.from_settings(settings)
    design = simulated_design(settings, ["d1"], ["d1"], 15, (0.2, 0.2), seed=3)
    flat, wide = (replace(estimates(), frame_sd=(sd,) * 6) for sd in (0.001, 1.0))
    datasets = [simulate_blocks(design, est, Rules.from_settings(settings), "refit", "meaningful", i,
                                settings.master_seed, ("primary",), None)["primary"]
                for i, est in enumerate((flat, wide, flat, wide))]
    centred = SimpleNamespace(centring_min_ratio=0.0, centring_min_frames=2)  # every dataset centred
    s = SimpleNamespace(algorithm=acc.ADAPTIVE, chains=4, warmup=200, draws=200, extension_draws=100,
                        target_accept=0.9)
    fit = acc.fit_block(datasets, [], priors, h5p, centred, s, 11, settings.convergence, 1)

    # the case that breaks the rule: the flat datasets diverge in the centred form after the extension
    prog = acc.block_program(datasets[0], priors, h5p, rule=centred)
    assert "z_frame" not in prog.jm.names, prog.jm.names  # the centred form: no standardised frame effects
    _, first = acc.fit_with_remedy(prog, acc.tune(prog, np.stack([outcome(b) for b in datasets]), s, 11),
                                   np.stack([outcome(b) for b in datasets]), s, 11, settings.convergence, 1)
    before = [int(np.sum(d)) for d in first.divergences]
    diverging = [k for k, n in enumerate(before) if n > 0]
    assert diverging == [0, 2], before
    assert [p["divergences"] for p in fit.programs[:1]] == [before]

    refit = fit.programs[1]
    assert (refit["form"], refit["refit_of"], refit["datasets"]) == ("non_centred", "centred", diverging)
    assert len(fit.programs) == 2
    assert fit.forms == ["non_centred", "centred", "non_centred", "centred"]
    after = [int(np.sum(d)) for d in fit.divergences]
    assert [after[k] for k in diverging] == refit["divergences"]
    assert sum(after[k] for k in diverging) < sum(before[k] for k in diverging) and min(after) == 0, (before, after)
    for name, draws in fit.contrasts.items():
        for k in range(len(datasets)):
            if k in diverging:  # the other form's draws, not the first form's
                assert not np.array_equal(draws[k], first.draws[name][k])
            else:
                np.testing.assert_array_equal(draws[k], first.draws[name][k])


def test_each_divergent_dataset_is_refitted_once_from_the_form_it_was_fitted_in():
    """The refit's groups are fixed before any refit runs: datasets of both forms can diverge in
    one block, and a centred dataset refitted non-centred must not be refitted again with the
    non-centred group. The joint and H5 models (no form) and converged datasets are never refitted."""
    from fear_assets.simulation.accelerated import other_form, refits_in_other_form

    forms = ["centred", "non_centred", "centred", None, "non_centred", "centred"]
    divergences = [np.array([0, 2]), np.array([1, 0]), np.zeros(2), np.array([5, 5]), np.zeros(2), np.array([0, 1])]
    groups = refits_in_other_form(forms, divergences)
    assert groups == {"centred": [0, 5], "non_centred": [1]}
    assert sum(map(len, groups.values())) == len({k for v in groups.values() for k in v})
    assert {f: other_form(f) for f in groups} == {"centred": "non_centred", "non_centred": "centred"}
    assert refits_in_other_form(forms, [np.zeros(2)] * len(forms)) == {}
