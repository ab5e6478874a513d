"""The power gate (protocol 6.3, D7): generator, fitting with swapped data, targets and rules
on stored labels, and a small simulation end to end (primary block only, short sampler)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fear_assets.analysis.primary_model import Fitter, Priors, cell_means, hypotheses, posterior_draws
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import PilotEstimates, agent_effects, simulate_block, true_beta
from fear_assets.simulation.runner import LABEL_COLUMNS, Rules, run_batch
from fear_assets.simulation.store import batch_key, batch_path, parse_batch_key, read_batches, write_batch
from fear_assets.simulation.targets import (PowerTargets, dataset_readings, decide, gates_underpowered,
                                            label_frequencies, targets, trace_shortfall)


def _estimates(sigma: float = 0.2) -> PilotEstimates:
    corr = np.eye(6)
    corr[0, 3] = corr[3, 0] = 0.3
    return PilotEstimates(-0.3, {"depth[d1]": 0.02}, (0.15, 0.05, 0.05, 0.08, 0.03, 0.03),
                          tuple(map(tuple, corr)), 0.1, sigma, 8.0, (0.2, 0.2),
                          {"instructed_interaction": 0.3, "instructed_priority": 0.3, "marked_priority": 0.3})


# --- generator ---------------------------------------------------------------------------
def test_scenario_effects_solve_the_registered_contrasts(settings):
    e = agent_effects(0.30)  # D7: self 0.50, peer 0.20, person 0.20
    assert e == pytest.approx({"self": 0.5, "peer": 0.2, "person": 0.2})
    design = simulated_design(settings, ["d1", "d2", "d3"], ["d2", "d3"], 5, (0.2, 0.2), seed=1)
    d = design.data
    beta = true_beta(_estimates(), d, design.band, agent_effects(0.15))
    h = hypotheses(cell_means(d, beta[None, :], np.zeros(1), list(design.band)))
    for name in ("H1", "H2", "H3"):
        assert h[name][0] == pytest.approx(0.15)
    # constant over depth: the depth-specific threat-minus-harmless effect is the same at every depth
    one = hypotheses(cell_means(d, beta[None, :], np.zeros(1), ["d1"]))["H2"][0]
    assert one == pytest.approx(0.15)


def test_design_is_fixed_and_only_outcomes_differ(settings):
    a = simulated_design(settings, ["d1", "d2"], ["d1"], 10, (0.2, 0.2), seed=7)
    b = simulated_design(settings, ["d1", "d2"], ["d1"], 10, (0.2, 0.2), seed=7)
    assert a.rows == 10 * 3 * 2 * 2 * 6
    assert np.array_equal(a.data.X, b.data.X) and np.array_equal(a.data.Z, b.data.Z)
    est = _estimates()
    beta = true_beta(est, a.data, a.band, agent_effects(0.3))
    y1 = simulate_block(a.data, est, beta, 0.0, 1.5, np.random.default_rng(1))
    y2 = simulate_block(a.data, est, beta, 0.0, 1.5, np.random.default_rng(2))
    y1b = simulate_block(a.data, est, beta, 0.0, 1.5, np.random.default_rng(1))
    assert y1.X is a.data.X and np.array_equal(y1.frame, y2.frame)
    assert not np.allclose(y1.y, y2.y) and np.array_equal(y1.y, y1b.y)
    with pytest.raises(ValueError, match="multiple of the 5 fear classes"):
        simulated_design(settings, ["d1"], ["d1"], 52, (0.2, 0.2), seed=1)


# --- targets and rules on stored labels --------------------------------------------------
def _labels(n: int, spec: dict) -> pd.DataFrame:
    """Stored labels: spec[(scenario, contrast)] = list of (label, count) summing to n."""
    rows = []
    for (scenario, contrast), parts in spec.items():
        labs = [lab for lab, k in parts for _ in range(k)]
        assert len(labs) == n
        for i, lab in enumerate(labs):
            passed = None
            if contrast.startswith("control_"):
                passed, lab = lab == "pass", "supported" if lab == "pass" else "unresolved"
            rows.append({"family": "f", "scenario": scenario, "frames": 50, "dataset": i, "contrast": contrast,
                         "truth": 0.0, "mean": 0.0, "hdi_low": 0.0, "hdi_high": 0.0, "label": lab,
                         "practically_meaningful": False, "control_passed": passed, "rhat": 1.0, "ess_bulk": 500.0,
                         "ess_tail": 500.0, "divergences": 0, "converged": i != 0, "convergence_problems": "",
                         "fit_seconds": 1.0})
    return pd.DataFrame(rows, columns=LABEL_COLUMNS)


CONTROLS = ("control_addressee_name", "control_instructed_interaction", "control_instructed_priority",
            "control_marked_priority")


def _full(gate_c_meaningful: list) -> pd.DataFrame:
    n = 20
    sup, pe, un = "supported", "practically_equivalent", "unresolved"
    spec = {}
    for h in ("H1", "H2", "H3", "H4", "H5", "gate_a", "gate_b"):
        spec[("meaningful", h)] = [(sup, 19), (un, 1)]
        spec[("null", h)] = [(pe, 17), (un, 3)]
    spec[("meaningful", "gate_c")] = gate_c_meaningful
    spec[("null", "gate_c")] = [(pe, 20)]
    for c in CONTROLS:
        spec[("meaningful", c)] = [("pass", 20)]
        spec[("null", c)] = [("pass", 20)]
    return _labels(n, spec)


def _t(**kw) -> PowerTargets:
    base = dict(supported_at_meaningful_min=0.9, supported_at_zero_max=0.025, equivalent_at_zero_min=0.8,
                gate_b_pass_min=0.9, joint_top_reading_min=0.8, joint_top_reading_zero_max=0.025,
                frames_start=50, frame_block=10, frames_max=60)
    return PowerTargets(**{**base, **kw})


def test_label_frequencies_from_stored_labels():
    labels = _full([("supported", 18), ("unresolved", 2)])
    freq = label_frequencies(labels)
    row = freq[(freq["subset"] == "all") & (freq["contrast"] == "H2") & (freq["scenario"] == "meaningful")
               & (freq["label"] == "supported")].iloc[0]
    assert (row["count"], row["n"]) == (19, 20) and row["rate"] == pytest.approx(0.95)
    assert row["mcse"] == pytest.approx(np.sqrt(0.95 * 0.05 / 20))
    # without the fit that missed the convergence rule (dataset 0, which was Supported)
    conv = freq[(freq["subset"] == "converged") & (freq["contrast"] == "H2") & (freq["scenario"] == "meaningful")
                & (freq["label"] == "supported")].iloc[0]
    assert (conv["count"], conv["n"]) == (18, 19)


def test_targets_joint_reading_and_shortfall_rule():
    t = _t()
    ok = _full([("supported", 19), ("unresolved", 1)])
    rows = {r["target"]: r for r in targets(ok, t, 50)}
    assert rows["H2 Supported at the meaningful size"]["met"] is True
    assert rows["H2 Practically equivalent at zero"]["rate"] == pytest.approx(0.85)
    assert rows["H2 Supported at zero"]["met"] is True
    readings = dataset_readings(ok)
    top = readings[readings["scenario"] == "meaningful"]["reading"]
    # top reading needs H2, H5, gates a/c Supported and gate b passing: datasets 0..17 (indices with all 'supported')
    assert (top == "CONSISTENT_WITH_FRAMEWORK").sum() == 19
    assert rows["joint CONSISTENT_WITH_FRAMEWORK at meaningful"]["met"] is True
    # gate (c) Supported in only 10 of 20 -> joint and gate (c) targets miss; traced to the gates
    short = _full([("supported", 10), ("unresolved", 10)])
    rows = {r["target"]: r for r in targets(short, t, 50)}
    assert rows["joint CONSISTENT_WITH_FRAMEWORK at meaningful"]["met"] is False
    assert trace_shortfall(short, t, 50) == "gates"
    # frames: 50 misses, 60 not simulated yet -> the decision waits for 60 frames
    d = decide(short, t)
    assert d["frames"] is None and d["next_frames"] == 60 and not d["passed"]
    # at the last frame count the shortfall is decided: gates descriptive, read as underpowered
    d = decide(short, _t(frames_max=50))
    assert d["frames"] == 50 and d["joint_shortfall_source"] == "gates" and gates_underpowered(d)
    assert d["estimation_only"] == []  # every hypothesis met its own targets
    assert not gates_underpowered(decide(ok, _t(frames_max=50)))


def test_missing_components_are_not_computable_never_met():
    labels = _full([("supported", 19), ("unresolved", 1)])
    labels = labels[~labels["contrast"].isin(["H5", "gate_c"])]
    rows = {r["target"]: r for r in targets(labels, _t(), 50, not_simulated={"H5": "x", "gate_c": "y"})}
    assert rows["H5 Supported at the meaningful size"]["met"] is None
    assert rows["joint CONSISTENT_WITH_FRAMEWORK at meaningful"]["met"] is None
    d = decide(labels, _t(frames_max=50), {"H5": "x", "gate_c": "y"})
    assert d["status"].startswith("partial") and not d["passed"]


def test_batch_store_round_trip(tmp_path):
    key = batch_key("null", 50, 3)
    assert parse_batch_key(key) == ("null", 50, 3)
    labels = _full([("supported", 19), ("unresolved", 1)])
    path = batch_path(tmp_path, "f", key, "run")
    write_batch(path, labels)
    write_batch(batch_path(tmp_path, "f", batch_key("meaningful", 50, 0), "run"), labels.head(3))
    back = read_batches(path.parent)
    assert len(back) == len(labels) + 3 and not list(path.parent.glob("*.tmp"))


# --- fitting: compile once, swap data ----------------------------------------------------
@pytest.fixture(scope="module")
def small(settings):
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    fitter = Fitter(Priors.from_settings(settings), draws=100, tune=100, chains=2)
    return design, fitter


def test_swapping_data_gives_the_posterior_of_a_fresh_compile(settings, small):
    design, fitter = small
    est = _estimates()
    beta = true_beta(est, design.data, design.band, agent_effects(0.3))
    a = simulate_block(design.data, est, beta, 0.0, 1.5, np.random.default_rng(11))
    b = simulate_block(design.data, est, beta, 0.0, 1.5, np.random.default_rng(12))
    # Short chains: the test compares two samplers' draws, not the posterior's quality.
    quick = Fitter(Priors.from_settings(settings), draws=30, tune=30, chains=2)
    quick._compiled = fitter._compiled  # share the module's compiled model (one compilation per shape)
    quick.fit(a, seed=5)  # compiles for this shape (or reuses the module's)
    swapped = quick.fit(b, seed=5)  # same compiled model, b's data swapped in
    fresh = Fitter(Priors.from_settings(settings), draws=30, tune=30, chains=2).fit(b, seed=5)
    assert len(fitter._compiled) == 1
    np.testing.assert_allclose(posterior_draws(swapped, "beta"), posterior_draws(fresh, "beta"), rtol=1e-6, atol=1e-9)


def test_small_simulation_recovers_the_effect_and_keeps_false_positives_rare(settings, small, tmp_path):
    design, fitter = small
    est = _estimates(sigma=0.05)  # a quiet design so 5 frames have the power a test needs
    rules = Rules.from_settings(settings)
    meaningful = run_batch(fitter, design, est, rules, "f", "meaningful", range(2), settings.master_seed,
                           blocks=("primary",))
    null = run_batch(fitter, design, est, rules, "f", "null", range(4), settings.master_seed, blocks=("primary",))
    for frame, key in ((meaningful, batch_key("meaningful", 5, 0)), (null, batch_key("null", 5, 0))):
        write_batch(batch_path(tmp_path, "f", key, "run"), frame)
    labels = read_batches(tmp_path / "f" / "run")
    h2 = labels[labels["contrast"] == "H2"]
    # Recovered: every 99% HDI covers the planted 0.30, the posterior means average within 0.1 of
    # it, and no label contradicts it (a 5-frame design has too little power to require Supported).
    planted = labels[(labels["scenario"] == "meaningful") & labels["contrast"].isin(["H1", "H2", "H3"])]
    assert ((planted["hdi_low"] < 0.30) & (0.30 < planted["hdi_high"])).all()
    assert abs(planted.groupby("contrast")["mean"].mean() - 0.30).max() < 0.1
    assert not planted["label"].isin(["contrary", "practically_equivalent"]).any()
    zero = labels[(labels["scenario"] == "null") & labels["contrast"].isin(["H1", "H2", "H3"])]
    # 6.3's nominal rate: at most 2.5% Supported at zero (here: none of the 12 labels)
    assert (zero["label"] == "supported").mean() <= float(settings.section("power")["supported_at_zero_max"])
    # every fit keeps its diagnostics; the tally runs on the stored batches
    assert labels[["rhat", "ess_bulk", "ess_tail", "divergences"]].notna().all().all()
    d = decide(labels, PowerTargets(**{**PowerTargets.from_settings(settings).__dict__, "frames_start": 5,
                                       "frames_max": 5}), {"H4": "n", "H5": "n", "gate_c": "n"})
    rows = {r["target"]: r for r in d["targets"]}
    assert rows["H2 Supported at the meaningful size"]["n"] == 2
    assert rows["H2 Supported at the meaningful size"]["rate"] == (h2[h2["scenario"] == "meaningful"]["label"]
                                                                   == "supported").mean()
    assert d["status"].startswith("partial")


# --- Dagster wiring: partitions, resume --------------------------------------------------
def test_power_partitions_and_a_finished_batch_is_not_refitted(settings, tmp_path):
    import json

    import dagster as dg

    from fear_assets.assets.registration.power import _run_key, power_simulation
    from fear_assets.simulation.batches import batch_keys_of
    from fear_assets.resources.protocol import ProtocolResource

    keys = batch_keys_of(settings, "qwen2.5-7b")
    p = settings.section("power")
    assert len(keys) == len(p["scenarios"]) * 6 * (p["datasets"] // p["batch_size"])  # 50..100 frames
    assert keys[0] == "meaningful.f050.b000"
    demo = batch_keys_of(settings, "smollm2-135m")
    assert demo == [f"{s}.f{p['demo']['frames']:03d}.b000" for s in p["demo"]["scenarios"]]
    est = pd.DataFrame([{"estimates_json": json.dumps(_estimates().as_dict()), "band": "d1,d2"}])
    protocol = ProtocolResource(cache_dir=str(tmp_path / "cache"))
    path = batch_path(tmp_path / "power", "smollm2-135m", demo[0], _run_key(settings, "smollm2-135m", est))
    write_batch(path, _full([("supported", 20)]).head(2))
    key = dg.MultiPartitionKey({"family": "smollm2-135m", "batch": demo[0]})
    context = dg.build_asset_context(partition_key=key)
    result = power_simulation(context, protocol=protocol, power_pilot_estimates=est)
    assert result.metadata["resumed"] is True or result.metadata["resumed"].value is True
    wrong = dg.build_asset_context(partition_key=dg.MultiPartitionKey({"family": "smollm2-135m", "batch": keys[0]}),
                                   )
    with pytest.raises(ValueError, match="not part of family smollm2-135m"):
        power_simulation(wrong, protocol=protocol, power_pilot_estimates=est)
