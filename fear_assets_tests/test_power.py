"""The power gate (protocol 6.3, D7): generator, fitting with swapped data, targets and rules
on stored labels, and a small simulation end to end (primary block only, short sampler)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fear_assets.models.primary_model import Fitter, Priors, cell_means, hypotheses, posterior_draws
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


# --- the frame effects' parametrisation ---------------------------------------------------
def test_frame_effects_are_centred_only_where_each_frames_data_outweigh_their_scale(settings):
    """The registered rule (settings fitting.frame_parametrisation), on the scales it measured:
    centred at the threshold ratio and above it, non-centred as soon as one effect's SD falls
    below the threshold, with no slope variance, or with fewer frames than the registered least."""
    from fear_assets.models.parametrisation import FrameScales, choose_form

    rule = settings.fitting.frame_parametrisation
    ratio, least = rule.centring_min_ratio, rule.centring_min_frames
    se = np.array([0.02, 0.03, 0.03, 0.02, 0.03, 0.03])  # each effect's per-frame standard error
    choose = lambda sd, n=least: choose_form(FrameScales(tuple(sd), tuple(se), n), ratio, least)  # noqa: E731
    assert choose(ratio * se) == "centred"  # at the threshold
    assert choose(5 * se) == "centred"
    for j in range(6):  # one scale below its standard error is enough for the non-centred form
        below = 5 * se
        below[j] = 0.9 * ratio * se[j]
        assert choose(below) == "non_centred", j
    assert choose([0.5, 0, 0, 0, 0, 0]) == "non_centred"  # no slope variance: centring would funnel
    # Fewer frames than the registered least: the frame scales stay uncertain.
    assert choose(np.full(6, 10.0), least - 1) == "non_centred"
    # A simulation decides on each simulated dataset, as the analysis does on its data: large
    # frame scales against a small residual give centred, a large residual non-centred.
    from fear_assets.models.parametrisation import frame_parametrisation

    design = simulated_design(settings, ["d1", "d2"], ["d1", "d2"], least, (0.2, 0.2), seed=3)
    beta = true_beta(_estimates(), design.data, design.band, agent_effects(0.0))
    pinned = simulate_block(design.data, _estimates(sigma=0.01), beta, 0.0, 1.5, np.random.default_rng(4))
    noisy = simulate_block(design.data, _estimates(sigma=5.0), beta, 0.0, 1.5, np.random.default_rng(4))
    assert frame_parametrisation(pinned, rule) == "centred"
    assert frame_parametrisation(noisy, rule) == "non_centred"


# --- fitting: compile once, swap data ----------------------------------------------------
@pytest.fixture(scope="module")
def small(settings):
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    fitter = Fitter(Priors.from_settings(settings), draws=100, tune=100, chains=2, cache=[])
    return design, fitter


def test_swapping_data_gives_the_posterior_of_a_fresh_compile(settings, small):
    design, fitter = small
    est = _estimates()
    beta = true_beta(est, design.data, design.band, agent_effects(0.3))
    a = simulate_block(design.data, est, beta, 0.0, 1.5, np.random.default_rng(11))
    b = simulate_block(design.data, est, beta, 0.0, 1.5, np.random.default_rng(12))
    # Short chains: the test compares two samplers' draws, not the posterior's quality.
    quick = Fitter(Priors.from_settings(settings), draws=30, tune=30, chains=2,
                   cache=fitter._compiled)  # share the module's compiled model (one compilation per shape)
    quick.fit(a, seed=5)  # compiles for this shape (or reuses the module's)
    swapped = quick.fit(b, seed=5)  # same compiled model, b's data swapped in
    fresh = Fitter(Priors.from_settings(settings), draws=30, tune=30, chains=2, cache=[]).fit(b, seed=5)
    assert len(fitter._compiled) == 1 and quick.compilations + fitter.compilations <= 1
    np.testing.assert_allclose(posterior_draws(swapped, "beta"), posterior_draws(fresh, "beta"), rtol=1e-6, atol=1e-9)


def test_fitters_of_one_process_share_a_compiled_shape(settings, small):
    """The main job runs every step in one process: a shape one step's Fitter compiled is reused
    by the next step's Fitter (other sampler settings, another fixed-effect sd, which is data),
    never under other baked-in priors; a Fitter without a cache of its own uses the process's."""
    from dataclasses import replace

    from fear_assets.models import primary_model

    design, fitter = small
    est = _estimates()
    a = simulate_block(design.data, est, true_beta(est, design.data, design.band, agent_effects(0.3)), 0.0, 1.5,
                       np.random.default_rng(13))
    priors = Priors.from_settings(settings)
    compiled = Fitter(priors, draws=100, tune=100, chains=2, cache=fitter._compiled).compiled_for(a)
    other_sampler = Fitter(priors, draws=500, tune=500, chains=4, cache=fitter._compiled)
    assert other_sampler.compiled_for(a) is compiled and other_sampler.compilations == 0
    assert Fitter(Priors.from_settings(settings, fixed_sd=1.0), 100, 100, 2, cache=fitter._compiled).lookup(a) is compiled
    assert Fitter(replace(priors, group_sd=1.0), 100, 100, 2, cache=fitter._compiled).lookup(a) is None
    assert Fitter(priors, 100, 100, 2)._compiled is primary_model.COMPILED


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
    assert (zero["label"] == "supported").mean() <= settings.power.supported_at_zero_max
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

    from fear_assets.defs.assets.registration.power import power_simulation
    from fear_assets.defs.partitions import partition_key
    from fear_assets.simulation.setup import run_key as _run_key
    from fear_assets.simulation.batches import batch_keys_of
    from fear_assets.defs.resources.power import PowerSamplerResource
    from fear_assets.defs.resources.protocol import ProtocolResource

    keys = batch_keys_of(settings, "qwen2.5-7b")
    p = settings.power
    assert len(keys) == len(p.scenarios) * 6 * (p.datasets // p.batch_size)  # 50..100 frames
    assert keys[0] == "meaningful.f050.b000"
    demo = batch_keys_of(settings, "smollm2-135m")
    assert demo == [f"{s}.f{p.demo.frames:03d}.b000" for s in p.demo.scenarios]
    est = pd.DataFrame([{"estimates_json": json.dumps(_estimates().as_dict()), "band": "d1,d2"}])
    protocol = ProtocolResource(cache_dir=str(tmp_path / "cache"))
    path = batch_path(tmp_path / "power", "smollm2-135m", demo[0], _run_key(settings, "smollm2-135m", est))
    write_batch(path, _full([("supported", 20)]).head(2))
    key = partition_key("smollm2-135m", demo[0])
    assert key == f"{demo[0]}|smollm2-135m"  # the key the multi-partitions had
    context = dg.build_asset_context(partition_key=key)
    # the nutpie loop chosen: a finished batch is read back whatever the path
    result = power_simulation(context, protocol=protocol, power_sampler=PowerSamplerResource(path="nutpie"),
                              power_pilot_estimates=est)
    resumed = result.metadata["resumed"]
    assert getattr(resumed, "value", resumed) == "yes"  # a flag reads yes/no
    wrong = dg.build_asset_context(partition_key=partition_key("smollm2-135m", keys[0]))
    with pytest.raises(ValueError, match="not part of family smollm2-135m"):
        power_simulation(wrong, protocol=protocol, power_sampler=PowerSamplerResource(), power_pilot_estimates=est)


# --- every analysis model the reading needs (H4, H5, gates (a)-(c), the four controls) ------
def _all_estimates(sigma: float = 0.05) -> PilotEstimates:
    """Pilot estimates with every block's: H4's (log-odds scale, a document SD), H5's probit,
    the judge's residual SD and all four controls."""
    base = _estimates(sigma)
    h4 = {**_estimates(0.1).as_dict(), "document_sd": 0.1}
    h5 = {"criterion_intercept": 0.0, "position": 0.1, "criterion_frame_sd": 0.2, "dprime": 1.0,
          "dprime_frame_sd": [0.2] * 6}
    return PilotEstimates(base.intercept, base.beta, base.frame_sd, base.frame_corr, base.unit_sd, base.sigma,
                          base.nu, base.covariate_sd, {**base.controls, "addressee_name": 0.3}, h4, h5, 0.08)


def test_estimates_round_trip_and_old_records_read(settings):
    est = _all_estimates()
    assert PilotEstimates.from_dict(est.as_dict()) == est
    old = _estimates().as_dict()  # a record stored before H4/H5 existed: the same bytes, read back
    assert "h5" not in old and PilotEstimates.from_dict(old).h5 is None


def test_each_model_generator_plants_its_effect(settings):
    """Without sampling: the generated truths are the registered contrasts of each model."""
    from fear_assets.analysis.controls import addressee_contrast
    from fear_assets.models.h5_model import prepare_h5
    from fear_assets.simulation import models

    design = simulated_design(settings, ["d1", "d2"], ["d2"], 5, (0.2, 0.2), seed=3)
    est = _all_estimates()
    ad = design.addressee
    assert set(ad.table["agent"]) == {"addressee", "other_person"} and ad.data.covariates == ()
    assert len(ad.table) == 5 * 3 * 2 * 2 * 4 and design.h5_depth == "d2"
    # addressee: noise-free outcomes (zero variance components) give exactly the pilot contrast
    quiet = PilotEstimates(0.0, {}, (1e-9,) * 6, tuple(map(tuple, np.eye(6))), 1e-9, 1e-9, 8.0, (0.2, 0.2), {})
    table = models.addressee_table(ad, quiet, 0.3, 1.5, np.random.default_rng(0))
    cells = table.groupby(["agent", "content"])["outcome"].mean()
    assert addressee_contrast({k: np.array([v]) for k, v in cells.items()})[0] == pytest.approx(0.3, abs=1e-6)
    # gate (c): the judge block shares the primary block's frame effects (plus its own
    # agent x content deviations, test_gate_c_frame_deviations) and has no H2
    beta = true_beta(est, design.data, design.band, agent_effects(0.3))
    primary, frames = models.shared_primary(design, est, beta, 1.5, np.random.default_rng(1))
    again = simulate_block(design.data, est, beta, 0.0, 1.5, np.random.default_rng(1))
    assert np.array_equal(primary.y, again.y)  # the same draws as before frames were shared
    judge = models.judge_table(design, est, frames, 0.08, 1.5, np.random.default_rng(2))
    rng = np.random.default_rng(2)
    np.testing.assert_allclose(judge["outcome"].to_numpy(), simulate_block(
        design.data, est, true_beta(est, design.data, design.band, agent_effects(0.0)), 0.0, 1.5,
        rng, frames=models.own_frames(est, frames, 1.5, rng)).y * 0.08 / models.pilot_residual_sd(est))
    # H4: two content versions per document, each document's rows share the document index
    table4, d4 = models.h4_design(design)
    assert len(table4) == 2 * design.rows and d4.n_documents == design.rows and set(table4["option"]) == {1, 2}
    y4 = models.h4_table(table4, d4, est, design.band, 0.3, 1.5, np.random.default_rng(3))["log_odds"]
    assert y4.notna().all() and y4.std() > 0
    # H5: forced choices at the H5 depth plus content-removed trials; d'(self) difference planted
    rows = models.h5_rows(design, "d2")
    assert len(rows) == 2 * 5 * 3 * 2 * 6 and set(rows["shown_option"]) == {0, 1, 2}
    cells5 = [(a, c) for a in ("self", "peer", "person") for c in ("threat", "harmless")]
    h5 = models.H5Estimates(0.0, 0.0, 0.0, 1.0, (0.0,) * 6)
    big = pd.concat([rows] * 40, ignore_index=True)
    accuracy = {}
    for size in (0.0, 2.0):
        sim = models.h5_table(big, cells5, h5, size, 1.5, np.random.default_rng(4))
        shown = sim[sim["shown_option"] > 0]
        correct = shown["chose_option1"] == (shown["shown_option"] == 1)
        acc = correct.groupby([shown["agent"], shown["content"]]).mean()
        accuracy[size] = acc[("self", "threat")] - acc[("self", "harmless")]
        prepare_h5(sim, cells5)  # the analysis code reads the generated table
    assert abs(accuracy[0.0]) < 0.05 and accuracy[2.0] > 0.3
    with pytest.raises(ValueError, match="H5 depth"):
        models.h5_rows(design, "d9")


def test_blocks_without_pilot_estimates_are_not_simulated_never_met(settings):
    from fear_assets.simulation.runner import not_simulated

    missing = not_simulated(_estimates(), ("primary", "probe", "forced_choice", "control_addressee_name"))
    assert set(missing) >= {"H4", "H5", "control_addressee_name", "gate_c", "gate_a", "gate_b"}
    assert not not_simulated(_all_estimates(), tuple(__import__(
        "fear_assets.simulation.generator", fromlist=["x"]).PRIMARY_MODEL_BLOCKS))


@pytest.mark.slow
def test_every_analysis_model_in_a_test_sized_simulation(settings, tmp_path):
    """Every block fitted by its registered model (5 frames, one depth, short sampler): the
    planted meaningful effect is recovered, nothing is Supported at zero, the controls pass,
    and the registered targets are computable for every component."""
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    fitter = Fitter(Priors.from_settings(settings), draws=150, tune=150, chains=2)
    rules = Rules.from_settings(settings)
    est = _all_estimates()
    labels = pd.concat([run_batch(fitter, design, est, rules, "f", s, range(1), settings.master_seed)
                        for s in ("meaningful", "null")], ignore_index=True)
    contrasts = {"H1", "H2", "H3", "H4", "H5", "gate_a", "gate_b", "gate_c", "control_addressee_name",
                 "control_instructed_interaction", "control_instructed_priority", "control_marked_priority"}
    assert set(labels["contrast"]) == contrasts and len(labels) == 2 * len(contrasts)
    m = labels[labels["scenario"] == "meaningful"].set_index("contrast")
    covered = (m["hdi_low"] < m["truth"]) & (m["truth"] < m["hdi_high"])
    assert covered.mean() >= 10 / 12, m[["truth", "mean", "hdi_low", "hdi_high"]]
    z = labels[(labels["scenario"] == "null") & ~labels["contrast"].str.startswith("control_")]
    assert not (z["label"] == "supported").any()
    assert labels[["rhat", "ess_bulk", "divergences"]].notna().all().all()
    t = PowerTargets(**{**PowerTargets.from_settings(settings).__dict__, "frames_start": 5, "frames_max": 5})
    d = decide(labels, t)
    assert all(r["met"] is not None for r in d["targets"]), [r["target"] for r in d["targets"] if r["met"] is None]


def test_pilot_estimates_of_h4_and_h5_from_their_fits(settings):
    """The pilot estimates H4 and H5 are generated from: posterior means of each model's fit
    (fake posteriors with known means), and the pilot rows H5 is fitted on."""
    import arviz as az

    from fear_assets.simulation import models

    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=3)
    table, d4 = models.h4_design(design)
    p, n = len(d4.names), 10
    ones = lambda *shape: np.ones((2, n, *shape))  # noqa: E731
    post = {"intercept": 0.5 * ones(), "beta": 0.1 * ones(p), "frame_chol_stds": 0.2 * ones(6),
            "frame_chol_corr": np.broadcast_to(np.eye(6), (2, n, 6, 6)).copy(), "unit_sd": 0.3 * ones(),
            "sigma": 0.4 * ones(), "nu": 9.0 * ones(), "document_sd": 0.25 * ones()}
    h4 = models.h4_pilot_estimates(az.from_dict(posterior=post), d4)
    assert h4["document_sd"] == pytest.approx(0.25) and h4["sigma"] == pytest.approx(0.4)
    assert PilotEstimates.from_dict(h4).frame_sd == pytest.approx((0.2,) * 6)
    with pytest.raises(ValueError, match="document"):
        models.h4_pilot_estimates(az.from_dict(posterior=post), design.data)
    h5post = {"criterion_intercept": 0.1 * ones(), "criterion_beta": 0.2 * ones(6), "criterion_frame_sd": 0.3 * ones(),
              "dprime": np.broadcast_to(np.arange(6.0), (2, n, 6)).copy(), "dprime_frame_chol_stds": 0.4 * ones(6),
              "dprime_frame_chol_corr": np.broadcast_to(np.eye(6), (2, n, 6, 6)).copy()}
    h5 = models.h5_estimates(az.from_dict(posterior=h5post))
    assert (h5.criterion_intercept, h5.position, h5.criterion_frame_sd, h5.dprime) == pytest.approx((0.1, 0.2, 0.3, 2.5))
    scores = design.table.assign(fc_choice=[1, 2, 0] * (design.rows // 3), content_option=design.table["option"],
                                 item_id=design.table["frame"], excluded_context=False,
                                 generation_truncated=[True] + [False] * (design.rows - 1))
    from fear_assets.models.data import kept

    rows = models.h5_pilot_rows(scores, "d1")
    assert len(rows) == len(kept(scores)[kept(scores)["fc_choice"].isin([1, 2])])
    assert set(rows["shown_option"]) == {1, 2}
    with pytest.raises(ValueError, match="H5 depth"):
        models.h5_pilot_rows(scores, "d7")


def test_h4_pilot_estimates_come_from_a_fit_of_the_registered_h4_model(settings):
    """6.3: H4's pilot estimates (``PilotEstimates.h4``) are posterior means of the registered
    H4 model fitted to the pilot probe (``power_pilot_estimates`` calls ``h4_pilot_fit`` on a
    registered family): a dataset generated with a large document SD is fitted and the
    estimates carry a document SD, a residual scale and the primary model's parameters, in
    the form the generator reads back."""
    from fear_assets.models.primary_model import Priors
    from fear_assets.simulation import models

    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=4)
    table, d4 = models.h4_design(design)
    import dataclasses

    est = dataclasses.replace(_estimates(0.1), h4={**_estimates(0.1).as_dict(), "document_sd": 1.0})
    data = models.h4_table(table, d4, est, design.band, 0.3, 1.0, np.random.default_rng(5))
    h4 = models.h4_pilot_fit(data, settings.fears, Priors.from_settings(settings), 150, 150, 2, 7)
    back = PilotEstimates.from_dict(h4)
    assert h4["document_sd"] > 0.5, h4["document_sd"]  # the planted 1.0, not the residual's 0.1-scale
    assert len(back.frame_sd) == 6 and back.sigma > 0 and set(back.beta) == set(d4.names)
