"""A power-simulation batch on the accelerator path (6.3, D7): the same seeded datasets the
nutpie loop fits, one compiled program per frame form, the same label rows and rules, the
same bytes on a rerun, and the batch's record of its path and validation."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from fear_assets.models.parametrisation import frame_parametrisation
from fear_assets.models.primary_model import Fitter, Priors
from fear_assets.simulation.blocks import simulate_blocks
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import PilotEstimates
from fear_assets.simulation.runner import LABEL_COLUMNS, Rules, run_batch, run_batch_accelerated
from fear_assets.simulation.sampler_path import NUTPIE_LOOP


def _estimates() -> PilotEstimates:
    """A quiet 5-frame design (as test_power's small simulation) so a short fit is informative."""
    corr = np.eye(6)
    corr[0, 3] = corr[3, 0] = 0.3
    return PilotEstimates(-0.3, {"depth[d1]": 0.02}, (0.15, 0.05, 0.05, 0.08, 0.03, 0.03),
                          tuple(map(tuple, corr)), 0.1, 0.05, 8.0, (0.2, 0.2),
                          {"instructed_interaction": 0.3, "instructed_priority": 0.3, "marked_priority": 0.3})


@pytest.fixture(scope="module")
def batch(settings):
    """Three datasets of one batch on the accelerator path under the registered simulation
    sampler at short lengths."""
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    sampler = dataclasses.replace(settings.simulation_sampler, chains=2, warmup=100, draws=250, pilot_datasets=2,
                                  pilot_steps=150)
    args = (design, _estimates(), Rules.from_settings(settings), Priors.from_settings(settings),
            settings.fitting.frame_parametrisation, sampler, 0, "f", "meaningful", range(3, 6),
            settings.master_seed)
    table, programs = run_batch_accelerated(*args, blocks=("primary",))
    return design, args, table, programs


def test_an_accelerated_batch_is_labelled_like_the_loop_and_reproducible(settings, batch):
    design, args, table, programs = batch
    assert list(table.columns) == LABEL_COLUMNS
    # one row per dataset of the batch and reported contrast, in the loop's order
    assert list(zip(table["dataset"], table["contrast"])) == [(i, c) for i in range(3, 6) for c in ("H1", "H2", "H3")]
    assert set(table["sampler"]) == {f"accelerator:{settings.simulation_sampler.algorithm}"}
    assert (table["truth"] == settings.decision.meaningful).all()
    # each dataset's frame form is the registered rule's pick on that dataset's own data
    rule = settings.fitting.frame_parametrisation
    for i, part in table.groupby("dataset"):
        data = simulate_blocks(design, _estimates(), Rules.from_settings(settings), "f", "meaningful", int(i),
                               settings.master_seed, ("primary",), None)["primary"].data
        assert set(part["frame_parametrisation"]) == {frame_parametrisation(data, rule)}
    assert sum(len(p) for p in programs.values()) == table["frame_parametrisation"].nunique()
    # the registered convergence rule judges every row (a 5-frame design with 250 draws misses it somewhere)
    ok = ((table["rhat"] <= settings.convergence.rhat_max) & (table["ess_bulk"] >= settings.convergence.ess_bulk_min)
          & (table["ess_tail"] >= settings.convergence.ess_tail_min)
          & (table["divergences"] <= settings.convergence.divergences_max))
    assert (table["converged"] == ok).all()
    # every draw is seeded from the registered master seed: the same inputs, the same table
    again, _ = run_batch_accelerated(*args, blocks=("primary",))
    pd.testing.assert_frame_equal(table, again)


@pytest.mark.slow
def test_the_accelerated_batch_fits_the_datasets_the_nutpie_loop_fits(settings, batch):
    """The accelerator path must fit the same seeded outcomes the loop fits: on the same
    datasets their posterior means differ by Monte Carlo error only (about a tenth of a posterior
    SD here), while another dataset's mean lies about half an SD or more away."""
    design, args, table, _ = batch
    fitter = Fitter(Priors.from_settings(settings), draws=300, tune=300, chains=2,
                    rule=settings.fitting.frame_parametrisation)
    loop = run_batch(fitter, design, _estimates(), Rules.from_settings(settings), "f", "meaningful", range(3, 6),
                     settings.master_seed, blocks=("primary",))
    assert set(loop["sampler"]) == {NUTPIE_LOOP}
    assert list(zip(loop["dataset"], loop["contrast"])) == list(zip(table["dataset"], table["contrast"]))
    assert (loop["frame_parametrisation"].to_numpy() == table["frame_parametrisation"].to_numpy()).all()
    sd = (loop["hdi_high"] - loop["hdi_low"]).to_numpy() / 5.15  # a 99% interval spans about 5.15 SDs
    gap = np.abs(loop["mean"].to_numpy() - table["mean"].to_numpy()) / sd
    assert gap.max() < 0.5 and gap.mean() < 0.2, gap


@pytest.mark.slow
def test_power_simulation_forced_onto_the_accelerator_path_records_its_path(settings, tmp_path):
    """A pilot family's batch forced onto the accelerator path (a CPU host): the step's
    metadata names the path, the registered simulation sampler's settings and the validation's
    status (none configured), the stored labels say which sampler fitted them, and the finished
    batch is not refitted."""
    import dagster as dg

    from fear_assets.defs.assets.registration.power import power_simulation
    from fear_assets.defs.partitions import partition_key
    from fear_assets.defs.resources.power import PowerSamplerResource
    from fear_assets.defs.resources.protocol import ProtocolResource
    from fear_assets.simulation.batches import batch_keys_of
    from fear_assets.simulation.store import read_batches

    family = "smollm2-135m"
    key = batch_keys_of(settings, family)[0]
    est = pd.DataFrame([{"estimates_json": json.dumps(_estimates().as_dict()), "band": "d1,d2"}])
    protocol = ProtocolResource(cache_dir=str(tmp_path / "cache"))
    forced = PowerSamplerResource(path="accelerator")
    context = dg.build_asset_context(partition_key=partition_key(family, key))
    result = power_simulation(context, protocol=protocol, power_sampler=forced, power_pilot_estimates=est)
    meta = {k: getattr(v, "value", v) for k, v in result.metadata.items()}
    assert meta["sampler path"].startswith("accelerator (the host forced the accelerator path")
    s = settings.simulation_sampler
    assert f"algorithm {s.algorithm}" in meta["sampler settings"] and f"warmup {s.warmup}" in meta["sampler settings"]
    assert meta["accelerator validation"].startswith("none:")
    labels = read_batches(next((tmp_path / "power" / family).iterdir()))  # the run key's folder
    assert set(labels["sampler"]) == {f"accelerator:{s.algorithm}"}
    assert labels["dataset"].nunique() == meta["datasets"]
    resumed = power_simulation(context, protocol=protocol, power_sampler=forced, power_pilot_estimates=est)
    assert getattr(resumed.metadata["resumed"], "value", resumed.metadata["resumed"]) == "yes"


def test_the_record_counts_datasets_per_sampler_and_reads_old_batches_as_the_loops():
    from fear_assets.simulation.steps import datasets_per_sampler

    rows = [{"scenario": sc, "frames": 50, "dataset": i, "contrast": c, "sampler": sampler}
            for sc, i, sampler in (("null", 0, "nutpie_loop"), ("null", 1, "accelerator:chees_hmc"),
                                   ("meaningful", 0, "accelerator:chees_hmc"))
            for c in ("H1", "H2")]
    assert datasets_per_sampler(pd.DataFrame(rows)) == {"accelerator:chees_hmc": 2, "nutpie_loop": 1}
    old = pd.DataFrame(rows).drop(columns="sampler")  # a batch stored before the column: the loop's
    assert datasets_per_sampler(old) == {"nutpie_loop": 3}
    mixed = pd.concat([pd.DataFrame(rows).iloc[:2].assign(frames=60).drop(columns="sampler"), pd.DataFrame(rows)])
    assert datasets_per_sampler(mixed) == {"accelerator:chees_hmc": 2, "nutpie_loop": 2}
