"""The stage functions the shell's asset bodies call: they read the family's registered view
and derive what the bodies used to (seeds, the analysis's registered numbers, the power
result, output paths, the families a statement is about, check descriptions)."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from fear_assets.analysis.steps import analysis_registered, convergence_description, convergence_verdict
from fear_assets.core.hashing import derived_seed
from fear_assets.core.registered import registered
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.probes.steps import at_chance_description, probe_settings
from fear_assets.reading.steps import statement_families
from fear_assets.registration.steps import stored_power_section
from fear_assets.simulation.runner import dataset_seed

EMBEDDED, PRIMARY = "smollm2-135m", "qwen2.5-7b"


def test_view_seeds_are_the_derivations_the_steps_used_before(settings):
    view = registered(settings, PRIMARY)
    assert view.seed("power", PRIMARY, "design", 50, 0, "covariates") == dataset_seed(
        settings.master_seed, PRIMARY, "design", 50, 0, "covariates")
    for purpose in (("h4", PRIMARY, "pilot"), ("posteriors", PRIMARY, "H2"), ("power_pilot_h5", PRIMARY)):
        assert view.seed(*purpose) == derived_seed(settings.master_seed, *purpose) % (2**31)
    assert view.seed("h4", PRIMARY, "pilot") != view.seed("h4", PRIMARY, "confirmatory")


def test_the_analysis_reads_the_demo_remedy_only_for_the_embedded_family(settings):
    remedy = settings.fitting.convergence_remedy
    demo, primary = analysis_registered(registered(settings, EMBEDDED)), analysis_registered(registered(settings, PRIMARY))
    assert primary.convergence_remedy == remedy
    assert demo.convergence_remedy.max_extensions == remedy.demo_max_extensions
    assert (primary.hdi_prob, primary.sesoi, primary.draws) == (settings.decision.hdi_prob, settings.decision.sesoi,
                                                                settings.sampler.draws)
    assert primary.flag_rate == settings.exclusion.cell_flag_rate


def test_probe_settings_come_from_the_view(settings):
    p = probe_settings(registered(settings, PRIMARY))
    assert (p.inverse_regularisation, p.clip, p.interval, p.master_seed) == (
        settings.probe.inverse_regularisation, settings.probe.clip, settings.probe.control_interval,
        settings.master_seed)


def test_the_record_reads_the_power_section_the_stored_summary_names(tmp_path):
    path = tmp_path / "power.json"
    path.write_text(json.dumps({"status": "passed", "frames": 60}), encoding="utf-8")
    assert stored_power_section(pd.DataFrame([{"target": "t", "power_json": str(path)}])) == {
        "status": "passed", "frames": 60}
    assert stored_power_section(pd.DataFrame([{"target": "t", "power_json": str(tmp_path / "gone.json")}])) is None
    assert stored_power_section(pd.DataFrame()) is None


def test_output_paths_sit_beside_the_cache(tmp_path):
    protocol = ProtocolResource(cache_dir=str(tmp_path / "cache"))
    assert protocol.output_path("posteriors", "fam", "h4_pilot.nc") == tmp_path / "posteriors" / "fam" / "h4_pilot.nc"
    assert protocol.output_path("reports") == tmp_path / "reports"
    assert protocol.output_path("topic_counts.csv") == tmp_path / "topic_counts.csv"


def test_a_cross_family_statement_is_about_the_registered_families_only(settings):
    families = statement_families(settings.families)
    assert PRIMARY in families and EMBEDDED not in families
    assert set(families) == {k for k, f in settings.families.items() if f.role != "embedded"}


def test_check_descriptions_follow_the_settings(settings):
    assert f"R-hat <= {settings.convergence.rhat_max}" in convergence_description(settings)
    changed = dataclasses.replace(settings.convergence, rhat_max=1.05, divergences_max=2)
    text = convergence_description(type("S", (), {"convergence": changed})())
    assert "R-hat <= 1.05" in text and "at most 2 divergences" in text
    assert f"{settings.probe.control_interval:.0%} interval" in at_chance_description(settings)


def test_a_miss_on_a_reading_estimand_blocks_and_a_secondary_miss_warns():
    rows = pd.DataFrame([
        {"contrast": "H2", "kind": "confirmatory", "status": "estimated", "rhat": 1.2, "convergence_problems": "rhat"},
        {"contrast": "S1", "kind": "secondary", "status": "estimated", "rhat": 1.0, "convergence_problems": ""}])
    verdict = convergence_verdict(rows)
    assert not verdict.passed and verdict.blocking and "H2: rhat" in verdict.description
    secondary = convergence_verdict(rows.assign(convergence_problems=["", "ess"]))
    assert not secondary.passed and not secondary.blocking
    assert convergence_verdict(rows.assign(convergence_problems="")).passed


def test_a_fitted_batch_reports_forms_per_dataset_and_its_misses(tmp_path):
    from fear_assets.simulation.steps import BatchResult

    labels = pd.DataFrame({"dataset": [0, 0, 1, 1], "frame_parametrisation": ["centred", "centred", "non_centred", None],
                           "converged": [True, False, True, True], "contrast": ["H2", "H5", "H2", "H5"],
                           "label": ["supported", "unresolved", "supported", "supported"]})
    batch = BatchResult(tmp_path / "b.parquet", False, labels)
    assert batch.frame_forms == {"centred": 1, "non_centred": 1}
    assert batch.not_converged == 1
    assert batch.label_counts.set_index(["contrast", "label"])["datasets"].to_dict() == {
        ("H2", "supported"): 2, ("H5", "supported"): 1, ("H5", "unresolved"): 1}
