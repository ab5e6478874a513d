"""Issue 15: figures, the Stage 2 report, the deviations table and the data record (pure functions)."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from fear_assets.analysis.plots import (COLOURS, NOT_CONVERGED_COLOUR, NOT_CONVERGED_TEXT, PNG_MAGIC, forest_plot,
                                        row_style)
from fear_assets.defs.metadata import metadata_image
from fear_assets.report import plots
from fear_assets.report.data_record import (NULL_REASONS, RECORD_COLUMNS, RecordInputs, collection_order, data_record,
                                            to_parquet_bytes)
from fear_assets.report.stage2 import (FamilyReport, Provenance, Ran, Section, deviations, hypotheses_table,
                                       render_html)


def _pixels(png: bytes) -> np.ndarray:
    import matplotlib.image as mpimg

    return (mpimg.imread(io.BytesIO(png), format="png")[..., :3] * 255).round().astype(int)


def _has_colour(png: bytes, hex_colour: str, tol: int = 6) -> bool:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return bool((np.abs(_pixels(png) - rgb).max(axis=-1) <= tol).any())


def test_a_non_converged_supported_label_is_never_drawn_in_the_supported_colour():
    assert row_style("supported", False) == (NOT_CONVERGED_COLOUR, NOT_CONVERGED_TEXT)
    assert row_style("supported", True)[0] == COLOURS["supported"]
    table = pd.DataFrame({"contrast": ["H4"], "mean": [1.0], "hdi_low": [0.5], "hdi_high": [1.5],
                          "label": ["supported"], "converged": [False]})
    grey = forest_plot(table, (-0.15, 0.15), 0.99, "H4 not converged")
    assert grey.startswith(PNG_MAGIC)
    assert not _has_colour(grey, COLOURS["supported"])
    assert _has_colour(grey, NOT_CONVERGED_COLOUR)
    # The same row, converged, is drawn green: the pixel test can fail.
    green = forest_plot(table.assign(converged=[True]), (-0.15, 0.15), 0.99, "H4 converged")
    assert _has_colour(green, COLOURS["supported"])


def test_gate_figures_render_with_their_thresholds_and_refuse_bad_input():
    outputs = pd.DataFrame({"frame_set": "pilot", "depth_index": [1, 1, 2, 2], "correct": [1, 0, 1, 1]})
    controls = pd.DataFrame({"frame_set": "pilot", "probe": ["probe", "depth"], "accuracy": [0.9, 0.5],
                             "interval_low": [0.8, 0.4], "interval_high": [0.95, 0.6]})
    assert plots.probe_accuracy_plot(outputs, controls).startswith(PNG_MAGIC)
    frames = pd.DataFrame({"item_id": ["TER-01", "ISO-01"], "max_abs_difference": [0.2, 0.7], "passes": [True, False]})
    png = plots.matching_plot(frames, 0.5)
    assert _has_colour(png, plots.PASS) and _has_colour(png, plots.FAIL)
    with pytest.raises(ValueError, match="tolerance"):
        plots.matching_plot(frames, 0.0)
    binding = pd.DataFrame({"item_id": ["TER-01"], "n_checks": [18], "n_correct": [18], "passes": [True],
                            "in_context_rate": [0.5]})
    assert plots.binding_plot(binding, 0.9).startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="n_checks"):
        plots.binding_plot(binding.drop(columns="n_checks"), 0.9)
    assert plots.matching_plot(frames.iloc[:0], 0.5).startswith(PNG_MAGIC)  # empty design: a note, not a failure
    labels = pd.DataFrame({"contrast": ["H2"] * 3, "label": ["supported", "supported", "unresolved"],
                           "converged": [True, False, True]})
    freq = plots.label_frequency_plot(labels)
    assert _has_colour(freq, NOT_CONVERGED_COLOUR) and _has_colour(freq, COLOURS["supported"])
    gate = pd.DataFrame({"name": ["Orin", "Orin", "Tavi"], "tokenizer": ["tested", "judge", "tested"],
                         "form": ["mid_sentence"] * 3, "n_tokens": [1, 2, 1]})
    shown = plots.name_gate_table(gate, ["Tavi", "Orin"])
    assert list(shown.index) == ["Tavi", "Orin"]
    assert shown.loc["Orin", ("judge", "mid_sentence")] == "2 SPLIT"
    assert shown.loc["Orin", ("tested", "mid_sentence")] == "1"
    grid = plots.name_gate_plot(gate, ["Tavi", "Orin"])
    assert grid.startswith(PNG_MAGIC) and _has_colour(grid, "#f29999", tol=3)  # a split cell is red
    assert metadata_image(freq, "x").value.startswith("![x](data:image/png;base64,")


def test_deviations_find_what_differs_from_the_registration():
    registered = {"bank_sha256": ["aaa"], "models": ["tested: m1", "judge: m2"], "depths": ["d1", "d2"],
                  "H5 depth": "d2", "sampler draws": 1000}
    ran = {"bank_sha256": Ran(["aaa"], "frame_bank"), "models": Ran(["judge: m2", "tested: m1"], "model_manifest"),
           "depths": Ran(["d1"], "scores"), "H5 depth": Ran("d2", "posteriors")}
    table = deviations(registered, ran, [{"section": "4.3", "protocol": "p", "implemented": "i", "why": "w"}],
                       unordered=["models", "bank_sha256"])
    by = table.set_index("item")
    assert not by.loc["bank_sha256", "deviates"]
    assert not by.loc["models", "deviates"]  # same checkpoints, other order
    assert by.loc["depths", "deviates"] and by.loc["depths", "ran"] == "d1"
    assert by.loc["sampler draws", "deviates"]  # registered, not found in what ran
    assert by.loc["declared: 4.3", "deviates"]
    assert by.loc["models", "source"] == "model_manifest"


def _posteriors():
    return pd.DataFrame({
        "contrast": ["H2", "H4", "gate_a", "H1_recall"], "kind": ["confirmatory", "confirmatory", "gate", "secondary"],
        "status": ["estimated", "estimated", "not_scored", "estimated"], "mean": [0.3, 2.0, np.nan, 0.1],
        "hdi_low": [0.1, 1.0, np.nan, -0.1], "hdi_high": [0.5, 3.0, np.nan, 0.2],
        "label": ["supported", "supported", "", "unresolved"], "converged": [True, False, True, True]})


def test_the_report_states_a_non_converged_label_as_not_to_be_read_and_names_every_source():
    hyp = hypotheses_table(_posteriors())
    by = hyp.set_index("contrast")["label as read"]
    assert by["H2"] == "supported" and by["H4"] == NOT_CONVERGED_TEXT and by["gate_a"] == "not scored"
    assert "H1_recall" not in by.index  # secondary estimands are not the registered hypotheses
    src = Provenance("posteriors", "fam", "run-123", "dv-9")
    doc = render_html("Stage 2 report: fam", "preamble", [FamilyReport("fam", [Section("Hypotheses", "", hyp, [src])])])
    assert "posteriors [fam] · run run-123 · data version dv-9" in doc
    assert NOT_CONVERGED_TEXT in doc
    assert "http://" not in doc and "https://" not in doc and "<script" not in doc  # self-contained
    unnamed = render_html("t", "", [FamilyReport("fam", [Section("Gates", "", hyp, [])])])
    assert "no materialisation recorded" in unnamed


def test_collection_order_puts_positive_controls_first_then_interleaves_cells():
    trials = pd.DataFrame({
        "trial_id": [f"t{i}" for i in range(8)],
        "block": ["primary"] * 6 + ["control_marked_priority", "pilot_control_addressee_name"],
        "condition_code": ["C1", "C1", "C1", "C2", "C2", "C3", "C9", "C8"]})
    pos = collection_order(trials)
    ordered = trials.assign(pos=pos).sort_values("pos")
    assert list(ordered["block"].iloc[:2].str.contains("control")) == [True, True]
    assert list(ordered["condition_code"].iloc[2:]) == ["C1", "C2", "C3", "C1", "C2", "C1"]
    assert sorted(pos) == list(range(8))
    pd.testing.assert_series_equal(pos, collection_order(trials.sample(frac=1, random_state=1)).reindex(pos.index))


def _record_inputs():
    base = {"family": "fam", "depth": "d1", "block": "primary", "block_kind": "agent", "reader": "tested",
            "item_id": "TER-01", "fear": "termination", "rotation": 1, "order": 1, "content_option": 1,
            "n_tokens": 100, "attention_agent": 0.2, "attention_partner": 0.1, "agent_name_mean": -1.0,
            "partner_name_mean": -1.5, "agent_recall_mean": -2.0, "report_score_agent": -1.0,
            "report_score_partner": -1.5, "delta": 0.5, "delta_recall": 0.1, "generated_text": "Orin is deleted.",
            "generation_truncated": False, "p_option1": 0.6, "fc_choice": 1, "fc_correct": True,
            "choice_logprobs": "[-0.5, -0.9]", "features_file": "f.npy", "feature_row": 0, "features_sha256": "abc",
            "excluded_context": False, "exclusion_reason": "", "answer_exceeds_context": False,
            "checkpoint": "m1", "settings_sha256": "s", "bank_sha256": "b"}
    scores = pd.DataFrame([{**base, "trial_id": "t1", "condition_code": "C1"},
                           {**base, "trial_id": "t2", "condition_code": "C2"}])
    controls = pd.DataFrame([{**base, "trial_id": "c1", "condition_code": "C9", "block": "pilot_control_marked_priority"}])
    trial_table = pd.DataFrame({"trial_id": ["t1", "t2", "c1"], "depth_tokens": 32, "n_prefix_tokens": 60,
                                "n_distractor_tokens": 32, "continuations": '{"agent": {"name": "Orin is deleted."}}'})
    surprisal = pd.DataFrame({"item_id": "TER-01", "rotation": 1, "option": 1, "agent": ["self", "peer"],
                              "content": "threat", "name_nll": [3.0, 3.1], "rest_nll": [20.0, 20.2], "n_tokens": 12,
                              "n_name_tokens": 1})
    scoring = pd.DataFrame({"trial_id": ["t1", "t1"], "side": ["agent", "partner"], "rule": [True, False],
                            "scorer": [True, False], "final": [True, False], "category": ["mention", "no_mention"]})
    binding = pd.DataFrame({"item_id": ["TER-01"], "passes": [True], "n_correct": [18], "n_checks": [18]})
    probes = pd.DataFrame({"trial_id": ["t1"], "frame_set": ["pilot"], "p_correct": [0.9], "log_odds": [2.2],
                           "correct": [True]})
    manifest = pd.DataFrame({"checkpoint": ["m1", "m1"], "file": ["model.safetensors", "config.json"],
                             "sha256": ["w1", "c1"], "versions": ['{"torch": "2"}'] * 2})
    record = {"protocol": "two-facts-one-gate", "protocol_version": "v1"}
    return RecordInputs(scores, trial_table, surprisal, scoring, binding, probes, manifest, record, controls,
                        {("scores", "d1"): (1700000000.0, "run-a"), ("control_scores", "d1"): (1690000000.0, "run-b")})


def test_data_record_joins_every_appendix_b_field_in_collection_order_and_stays_masked():
    rec = data_record(_record_inputs())
    assert list(rec.columns) == RECORD_COLUMNS
    assert list(rec["trial_id"]) == ["c1", "t1", "t2"]  # positive control first
    assert list(rec["collection_position"]) == [0, 1, 2]
    assert list(rec["scored_in_run"]) == ["run-b", "run-a", "run-a"]
    t1 = rec.set_index("trial_id").loc["t1"]
    assert json.loads(t1["weight_sha256"]) == {"model.safetensors": "w1", "config.json": "c1"}
    assert {r["agent"] for r in json.loads(t1["sentence_surprisal"])} == {"self", "peer"}
    assert [r["side"] for r in json.loads(t1["report_scorings"])] == ["agent", "partner"]
    assert json.loads(t1["binding_result"])["passes"] is True
    assert json.loads(t1["probe_output"])[0]["log_odds"] == 2.2
    assert t1["n_prefix_tokens"] == 60 and t1["depth_tokens"] == 32
    assert rec["registration_id"].isna().all() and "registration_id" in NULL_REASONS
    # Masked: no column reveals the condition behind a code.
    assert not {"agent", "content", "condition", "cell_index"} & set(rec.columns)
    data, digest = to_parquet_bytes(rec)
    assert to_parquet_bytes(data_record(_record_inputs()))[1] == digest  # same inputs -> same bytes
    assert pd.read_parquet(io.BytesIO(data)).shape == rec.shape


def test_stage2_report_through_dagster_names_its_sources_and_what_is_not_materialised(tmp_path):
    import dagster as dg

    from fear_assets.defs.definitions import all_assets, all_checks, resources

    instance = dg.DagsterInstance.ephemeral()
    res = resources(str(tmp_path / "store.duckdb"), cache_dir=str(tmp_path / "cache"))
    everything = [*all_assets, *all_checks]
    bank_run = dg.materialize(everything, selection=["frame_bank"], instance=instance, resources=res)
    result = dg.materialize(everything, selection=["stage2_report"], partition_key="smollm2-135m", instance=instance,
                            resources=res)
    (event,) = result.get_asset_materialization_events()
    path = event.materialization.metadata["report"].value
    doc = open(path, encoding="utf-8").read()
    assert f"frame_bank · run {bank_run.run_id}" in doc  # the deviations' bank hash names its run
    assert "not materialised yet: posteriors" in doc
    assert "section8_reading" in event.materialization.metadata["not materialised yet"].value


def test_a_depth_outside_a_family_design_or_band_is_not_applicable(settings):
    from fear_assets.design.applicable import not_applicable

    embedded = settings.family("smollm2-135m")
    inside, outside = embedded.depth_keys[0], "d7"
    assert outside not in embedded.depth_keys
    assert not_applicable(settings, "smollm2-135m", inside) is None
    assert "registers depths" in not_applicable(settings, "smollm2-135m", outside)
    assert "outside the depth band" in not_applicable(settings, "smollm2-135m", inside, band=["d9"])
    assert not_applicable(settings, "qwen2.5-7b", "d7") is None  # a registered family has all eight
