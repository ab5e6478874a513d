"""The power simulation's GPU route (issue 11, deliverable 6; benchmarks/power_gpu.py), on a
small design in seconds: the registered model's log density exported with ``jax.export``
equals PyMC's own compiled log density and gradient; the exported function, wrapped for
BlackJAX, gives the same NUTS draws as the in-process JAX graph; the device-side ``run``
works end to end without PyMC, ArviZ or the fear_assets package; the NumPy ESS/R-hat equal
ArviZ's."""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fear_assets.core.settings import PROJECT_ROOT



@pytest.fixture(scope="module")
def power_gpu():
    spec = importlib.util.spec_from_file_location("bench_power_gpu", PROJECT_ROOT / "benchmarks" / "power_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def small(power_gpu, tmp_path_factory):
    """5 frames x 2 depths (360 rows), 3 datasets: the export written as on the CPU host."""
    out = tmp_path_factory.mktemp("gpu_power")
    power_gpu.export(argparse.Namespace(frames=5, depths=2, datasets=3, check_points=3, out=str(out)))
    return out


def test_the_device_scripts_offer_every_candidate_the_package_fits(power_gpu):
    """The device imports no model module, so its scripts name the candidates themselves: a
    candidate added to the package (``accelerated.ADAPTIVE_ALGORITHMS``) must be runnable there,
    with the same sampler options."""
    from fear_assets.simulation import accelerated

    assert set(power_gpu.ADAPTIVE_CANDIDATES) == set(accelerated.ADAPTIVE_ALGORITHMS)
    # and each name selects on the device the sampler options it selects in the package (accelerated.tune)
    for name in accelerated.ADAPTIVE_ALGORITHMS:
        assert power_gpu.candidate_options(name) == {"dense": name in accelerated.DENSE_ALGORITHMS,
                                                     "shrink_dense": name == accelerated.ADAPTIVE_DENSE_OAS,
                                                     "pool_length": name == accelerated.ADAPTIVE_DENSE_POOLED}, name


def _model(settings):
    sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
    from power import datasets

    from fear_assets.models.primary_model import Priors, build_model

    design, warm, data = datasets(settings, 5, 2, 3)
    return design, warm, data, build_model(warm, Priors.from_settings(settings))


def test_exported_logdensity_equals_pymcs_compiled_logp_and_gradient(power_gpu, small, settings):
    from fear_assets.simulation.vectorised import check_export, export_logdensity, jaxified_logdensity

    _, warm, data, model = _model(settings)
    blob = gzip.decompress((small / power_gpu.EXPORT_FILE).read_bytes())
    jm = jaxified_logdensity(model)
    points = jm.x0 + np.random.default_rng(3).normal(0.0, 0.5, (4, jm.dim))
    check = check_export(model, jm, blob, warm.y, points)
    assert check["logp_rel"] < 1e-8 and check["dlogp_rel"] < 1e-8, check
    # the check can fail: PyMC's model holds the reference outcome, the export given another one
    other = check_export(model, jm, blob, data[0].y, points)
    assert other["logp"] > 1.0
    # same model, same program: two exports differ at most in debug source locations
    import jax

    def program(b):
        text = jax.export.deserialize(bytearray(b)).mlir_module()
        return [re.sub(r"loc\((?:[^()]|\([^()]*\))*\)", "", line) for line in text.splitlines()
                if not line.startswith("#loc")]

    assert program(export_logdensity(jm.logdensity, jm.dim, len(warm.y))) == program(blob)
    manifest = json.loads((small / "manifest.json").read_text())
    assert manifest["rows"] == 360 and manifest["dim"] == jm.dim and manifest["platforms"] == ["cpu", "cuda"]
    assert manifest["sampler"]["draws"] == settings.sampler.draws
    assert manifest["settings_sha256"] == settings.sha256


def test_contrast_weights_reproduce_the_registered_hypotheses(small, settings):
    from fear_assets.models.primary_model import cell_means, hypotheses

    design, warm, _, _ = _model(settings)
    arr = np.load(small / "arrays.npz")
    kept = np.random.default_rng(4).normal(size=(5, arr["contrast_W"].shape[0]))
    h = hypotheses(cell_means(warm, kept[:, 1:], kept[:, 0], list(design.band)))
    got = kept @ arr["contrast_W"] + arr["contrast_c"]
    for j, name in enumerate(json.loads((small / "manifest.json").read_text())["contrasts"]):
        np.testing.assert_allclose(got[:, j], h[name], atol=1e-12)


def test_exported_log_density_gives_the_in_process_graphs_nuts_steps(power_gpu, small, settings):
    """custom_vmap / custom_vjp around the export: vmapped value and gradient and one vmapped
    NUTS transition equal the in-process graph's (a whole chain is not compared: NUTS
    trajectories amplify 1e-15 roundoff differences of two compilations chaotically)."""
    import blackjax
    import jax
    import jax.numpy as jnp

    from fear_assets.simulation.vectorised import exported_logdensity, jaxified_logdensity

    jax.config.update("jax_enable_x64", True)
    _, _, data, model = _model(settings)
    jm = jaxified_logdensity(model)
    ld = exported_logdensity(gzip.decompress((small / power_gpu.EXPORT_FILE).read_bytes()))
    x = jnp.asarray(jm.x0 + np.random.default_rng(5).normal(0.0, 0.3, (3, jm.dim)))
    Y = jnp.asarray(np.stack([d.y for d in data]))
    for a, b in zip(jax.vmap(jax.value_and_grad(ld))(x, Y), jax.vmap(jax.value_and_grad(jm.logdensity))(x, Y)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-9)

    def one_step(logdensity):
        def step(key, x0, y):
            kern = blackjax.nuts(lambda z: logdensity(z, y), 0.05, jnp.ones(jm.dim))
            state, info = kern.step(key, kern.init(x0))
            return state.position, info.num_integration_steps
        return jax.jit(jax.vmap(step))

    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    (pa, na), (pb, nb) = one_step(ld)(keys, x, Y), one_step(jm.logdensity)(keys, x, Y)
    np.testing.assert_array_equal(np.asarray(na), np.asarray(nb))
    assert np.asarray(na).min() >= 1
    np.testing.assert_allclose(np.asarray(pa), np.asarray(pb), atol=1e-9)
    assert float(jnp.abs(pa - x).max()) > 1e-3  # the transition moved


def test_the_export_names_the_block_metrics_dense_coordinates(small):
    """The block metric (``adaptive_hmc_dense``) is dense on every coordinate but the unit
    intercepts; the export writes those coordinates, so the device reads them, not the names."""
    manifest = json.loads((small / "manifest.json").read_text())
    offsets = dict(zip(manifest["names"], np.cumsum([0, *manifest["sizes"]])))
    units = set(range(offsets["z_unit"], offsets["z_unit"] + manifest["sizes"][manifest["names"].index("z_unit")]))
    dense = np.load(small / "arrays.npz")["dense_idx"]
    assert units and set(dense.tolist()) == set(range(manifest["dim"])) - units


def test_the_device_run_refuses_an_export_without_the_dense_coordinates(power_gpu, small, tmp_path, monkeypatch):
    """An export written before the block metric has no ``dense_idx``: the dense run stops before
    any timing, naming the file, the missing field and the command that writes a new export."""
    old = tmp_path / "old_export"
    old.mkdir()
    for name in ("manifest.json", power_gpu.EXPORT_FILE):
        (old / name).write_bytes((small / name).read_bytes())
    arrays = dict(np.load(small / "arrays.npz"))
    del arrays["dense_idx"]
    np.savez(old / "arrays.npz", **arrays)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # restored after the test (run's --platform would set it for good)
    args = argparse.Namespace(artefacts=str(old), platform=None, max_seconds=60.0, algorithm="adaptive_hmc_dense")
    with pytest.raises(SystemExit, match=r"arrays\.npz: no dense_idx.*power_gpu\.py export"):
        power_gpu.run(args)


# Slow (the accelerator script run end to end on CPU, JAX compilations included). It guards that script: run it with
# -m slow before a device session; the export's log density and NUTS steps stay in the default run.
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["nuts", "adaptive_hmc", "adaptive_hmc_dense", "adaptive_hmc_dense_oas",
                                       "adaptive_hmc_dense_pooled"])
def test_device_run_works_without_pymc_arviz_or_the_package(small, tmp_path, algorithm):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OUT=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "benchmarks" / "power_gpu.py"), "run", "--artefacts",
                           str(small), "--platform", "cpu", "--datasets", "2", "--grad-batches", "1", "--reps", "2",
                           "--adapt", "15", "--warmup", "5", "--draws", "20", "--max-seconds", "300",
                           # the long-run comparison is the NUTS case's; adaptive_hmc's is `validate`'s
                           "--reference-draws", "60" if algorithm == "nuts" else "0", "--algorithm", algorithm],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "power_gpu.json").read_text())
    assert res["imported_project_modules"] == []
    # the fit's projection timed the batch it needs (2 datasets x 2 chains) rather than
    # extrapolating from batch 1 (which skipped every fit on the H200)
    assert set(res["b_vmapped_gradient"]) == {"1", "4"}
    fit = res["d_fit_many"]["2"]
    assert fit["draws"] == 20 and fit["gradients_per_dataset"] > 2 * 25  # 2 chains x (5 + 20) steps, >= 1 leapfrog each
    assert res["c_reference"]["algorithm"] == algorithm
    assert 0 < fit["h2_min_ess_mean"] and fit["wall_s_per_dataset"] > 0
    assert proc.stdout.strip().splitlines()[-1].startswith("power_gpu: device=cpu")
    # the block metric's dense coordinates come from the export (the device has no PyMC to read them)
    dense = np.load(small / "arrays.npz")["dense_idx"]
    dense_run = algorithm.startswith("adaptive_hmc_dense")
    assert res["c_reference"]["dense_block_size"] == (len(dense) if dense_run else None)
    assert res["c_reference"]["dense_shrinkage"] == ("oas" if algorithm == "adaptive_hmc_dense_oas" else None)
    assert res["c_reference"]["trajectory_length_pooled"] == (algorithm == "adaptive_hmc_dense_pooled")
    if algorithm != "nuts":
        assert "e_reference_hdi" not in res
        return
    ref = res["e_reference_hdi"]  # the candidate's keep rule: its HDIs against a long run of the same datasets
    assert ref["K"] == 2 and ref["draws"] == 60 and set(ref["per_contrast"]) == {"H1", "H2", "H3"}
    assert 0 < ref["max_abs_endpoint_diff"] == max(v["max_abs_endpoint_diff"] for v in ref["per_contrast"].values())


def test_numpy_ess_and_rhat_equal_arviz():
    import arviz as az

    from fear_assets.simulation import diagnostics

    rng = np.random.default_rng(6)
    for rho in (0.0, 0.9):
        x = np.zeros((2, 300))
        e = rng.normal(size=(2, 300))
        for t in range(1, 300):
            x[:, t] = rho * x[:, t - 1] + e[:, t]
        x[1] += 0.2
        assert diagnostics.ess_bulk(x) == pytest.approx(az.ess(x, method="bulk"), rel=1e-9)
        assert diagnostics.ess_tail(x) == pytest.approx(az.ess(x, method="tail"), rel=1e-9)
        assert diagnostics.rhat(x) == pytest.approx(az.rhat(x), rel=1e-9)
    # too short to estimate (a run cut at 2 or 3 draws per chain, or one chain for R-hat): NaN as in
    # ArviZ, which no convergence rule passes, where the autocovariance once ran out of lags
    for shape in ((4, 2), (4, 3), (1, 50)):
        x = rng.normal(size=shape)
        for ours, theirs in ((diagnostics.ess_bulk(x), az.ess(x, method="bulk")),
                             (diagnostics.ess_tail(x), az.ess(x, method="tail")),
                             (diagnostics.rhat(x), az.rhat(x))):
            assert np.isnan(ours) == np.isnan(theirs), shape
            assert np.isnan(ours) or ours == pytest.approx(theirs, rel=1e-9), shape
    assert all(np.isnan(diagnostics.ess_tail(rng.normal(size=(4, n)))) for n in (2, 3))
    assert np.isnan(diagnostics.rhat(rng.normal(size=(1, 50)))) and diagnostics.ess_bulk(rng.normal(size=(1, 50))) > 0


def test_numpy_hdi_equals_arviz():
    import arviz as az

    from fear_assets.simulation import diagnostics

    rng = np.random.default_rng(7)
    for n in (500, 2001):
        x = rng.standard_t(4, size=(2, n)) + rng.normal(size=(2, 1))
        assert diagnostics.hdi(x, 0.99) == pytest.approx(tuple(az.hdi(x.reshape(-1), hdi_prob=0.99)), abs=1e-12)
    with pytest.raises(ValueError, match="draws"):
        diagnostics.hdi(np.zeros(1), 0.99)
