"""Every registration gate reads right the first time: one row per gate with its outcome, its
numbers as text and the fix; no Python reprs; no row whose numbers claim the opposite of its
outcome; a check run for a family names it (its description and its metadata)."""

from __future__ import annotations

import json
import re

import dagster as dg
import numpy as np
import pandas as pd

from fear_assets.defs.assets.registration.record import registration_gates
from fear_assets.defs.definitions import resources
from fear_assets.defs.modes import named_metadata, readable_value
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.design.score_summary import block_summary, resume_summary
from fear_assets.registration.gate_table import gate_rows, gates_summary
from fear_assets.registration.gates import binding_outcomes, power_gate
from fear_assets.registration.pilot_gates import gates_table, probe_rules_gate
from fear_assets.registration.record import markdown

from fear_assets_tests.conftest import EMBEDDED

#: What a researcher must never read in a gate table: Python and JSON reprs of flags, missing
#: values and mappings.
REPRS = re.compile(r"\bTrue\b|\bFalse\b|\bnan\b|\bNone\b|\{|\}|\btrue\b|\bfalse\b|\bnull\b")


def _demo_power() -> dict:
    """A stored power result as the embedded demo writes it: the reduced demo simulation,
    partial (9 targets not computable), and ``gates_underpowered`` False because a demo
    decides nothing."""
    targets = ([{"target": f"t{i}", "met": True} for i in range(6)] + [{"target": f"m{i}", "met": False} for i in range(4)]
               + [{"target": f"n{i}", "met": None} for i in range(9)])
    return {"demo": True, "status": "partial: 9 target(s) not computable (components not simulated)",
            "gates_underpowered": False, "controls_to_strengthen": False, "estimation_only": ["H1"], "targets": targets}


def _gates() -> dict[str, dict]:
    """A record's gates, failed and passed, built by the gates' own functions where they
    exist, with the awkward values a gate's numbers can hold (None, NaN, flags)."""
    binding, _ = binding_outcomes(True, 40, 40, "ok", 6, {"termination": 1, "isolation": 0})
    ceiling = pd.DataFrame({"frame_set": ["pilot"], "h4_interpretable": [True], "h4_estimation_only": [True]})
    return {
        "name_gate (4.2)": {"passed": False, "numbers": {"selected": "Orin, Tavi, Kemi, Sora, Pell"},
                            "message": "fewer than five names are single tokens everywhere"},
        "matching (4.3)": {"passed": False, "numbers": {"frames passing": 0, "frames examined": 6, "events failing": 4,
                                                        "max TOST p": float("nan")},
                           "message": "write 1 new frame(s) for termination"},
        "zero_preference (4.3)": {"passed": True, "numbers": {"items failing": 0, "selected frames to rewrite": 0},
                                  "message": "every selected frame's questions lie within the band"},
        "binding single-sentence (4.2)": binding,
        "scorer_agreement (4.5)": {"passed": False, "numbers": {"kappa": None},
                                   "message": "kappa undefined. Fix (4.5): revise the keyword rule"},
        "probe rules (6.1)": probe_rules_gate(ceiling),
        "positive_controls (4.6)": {"passed": False, "numbers": {"marked_priority": "-0.076 [-0.153, -0.000]",
                                                                 "held": True},
                                    "message": "marked_priority: posterior mean -0.076 < 0.15"},
        "frame_selection (4.3)": {"passed": True, "numbers": {"confirmatory frames": 50},
                                  "message": "every fear has its frames"},
        "power (6.3)": power_gate(_demo_power(), EMBEDDED),
    }


def _cells(rows: pd.DataFrame) -> list[str]:
    return [str(c) for c in rows.to_numpy().ravel()]


def test_one_row_per_gate_with_outcome_numbers_and_fix_and_no_reprs():
    gates = _gates()
    rows = gate_rows(gates)
    assert list(rows.columns) == ["gate", "outcome", "numbers", "fix"]
    assert list(rows["gate"]) == list(gates)  # one row per gate, in the record's order
    assert set(rows["outcome"]) <= {"passed", "failed"}
    for row in rows.itertuples():
        passed = gates[row.gate]["passed"]
        assert row.outcome == ("passed" if passed else "failed")
        # A fix for every failed gate, "none" for every passed one.
        assert (row.fix == "none") == bool(passed), row
        assert row.numbers and row.fix
    bad = [c for c in _cells(rows) if REPRS.search(c)]
    assert not bad, bad
    by_gate = rows.set_index("gate")
    assert by_gate.loc["matching (4.3)", "numbers"] == ("frames passing: 0; frames examined: 6; events failing: 4; "
                                                         "max TOST p: n/a")
    assert by_gate.loc["scorer_agreement (4.5)", "numbers"] == "kappa: n/a"
    assert "write 1 new frame(s) for termination" in by_gate.loc["matching (4.3)", "fix"]


def test_the_demo_power_row_fails_and_its_numbers_say_why_without_claiming_the_opposite():
    row = gate_rows({"power (6.3)": power_gate(_demo_power(), EMBEDDED)}).iloc[0]
    assert row.outcome == "failed"
    assert "reduced demo, not the registered one" in row.numbers
    assert "targets not computable: 9" in row.numbers and "targets missed: 4" in row.numbers
    # The demo's gates_underpowered=False is no finding: the row must not read "underpowered: no/none".
    assert "underpowered gates: not decided" in row.numbers
    assert not re.search(r"underpowered[^;]*: (no|none|false)\b", row.numbers, re.IGNORECASE)
    assert "registered power simulation" in row.fix
    # Not stored at all: it says so and what to materialise.
    missing = gate_rows({"power (6.3)": power_gate(None, EMBEDDED)}).iloc[0]
    assert missing.outcome == "failed" and "none stored" in missing.numbers and "power_summary" in missing.fix


def test_the_probe_rules_row_agrees_with_its_outcome():
    """6.1's rules are declarations on H4 and never fail the gate: the numbers say so, and a
    pilot probe that never ran fails with numbers saying it did not run."""
    ceiling = pd.DataFrame({"frame_set": ["pilot"], "h4_interpretable": [False], "h4_estimation_only": [True]})
    row = gate_rows({"probe rules (6.1)": probe_rules_gate(ceiling)}).iloc[0]
    assert row.outcome == "passed" and row.fix == "none"
    assert "declared uninterpretable, carried to H4's row" in row.numbers
    assert "H4 estimation-only (ceiling): yes (declared" in row.numbers
    not_run = gate_rows({"probe rules (6.1)": probe_rules_gate(pd.DataFrame({"frame_set": []}))}).iloc[0]
    assert not_run.outcome == "failed" and not_run.numbers == "pilot probe: not run"
    assert "pilot_probe_outputs" in not_run.fix


def test_the_stored_table_and_the_record_markdown_carry_the_fix():
    gates = _gates()
    table = gates_table(gates, EMBEDDED)
    assert (table["fix"] == gate_rows(gates)["fix"]).all()
    record = {"protocol": "p", "protocol_version": "v", "family": EMBEDDED, "mode": "pilot", "status": "draft",
              "settings_sha256": "a", "bank_sha256": "b", "manifest_sha256": "c", "analysis_code_sha256": "d",
              "selected_names": [], "depth_band": [1], "band_rule": "r", "h5_depth": 1, "h5_rule": "r",
              "pilot_sigma": 0.3, "selected_frames": [], "gates": json.loads(json.dumps(gates, default=str)),
              "power": {**_demo_power(), "note": "REDUCED DEMO", "frames": 5, "frames_simulated": [5],
                        "joint_shortfall_source": None, "fits": 10, "fits_missing_convergence_rule": 10,
                        "not_simulated": {}, "targets": [{"target": "t", "frames": 5, "n": 0, "rate": float("nan"),
                                                          "mcse": float("nan"), "kind": "min", "bound": 0.9,
                                                          "met": None}]}}
    md = markdown(record)
    section = md[md.index("## Gates"):md.index("Failed gates")]
    assert "| gate | outcome | numbers | finding | fix |" in section
    assert not REPRS.search(section.replace("| finding |", "")), section
    assert "gates underpowered: not decided" in md


def test_the_check_run_for_a_family_names_it_in_its_description_and_metadata(tmp_path):
    """With several families a failed gate's page says whose gate it is: the check run for a
    family's partition names the family and the partition it ran for."""
    gates = _gates()
    stored = gates_table(gates, EMBEDDED)

    @dg.asset(name="registration_record", partitions_def=family_partitions, metadata=FAMILY_EXPR)
    def stand_in() -> pd.DataFrame:
        return stored

    with dg.instance_for_test() as instance:
        result = dg.materialize([stand_in, registration_gates], partition_key=EMBEDDED, instance=instance,
                                resources=resources(str(tmp_path / "store.duckdb"), registration_dir=str(tmp_path)))
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed
    failed = [n for n, g in gates.items() if not g["passed"]]
    assert evaluation.description == f"{EMBEDDED}: {len(failed)} of {len(gates)} gates failed: {', '.join(failed)}"
    assert len(evaluation.description) < 300  # short: the detail is in the gate table's rows
    meta = evaluation.metadata
    assert meta["family"].value == EMBEDDED and meta["partition"].value == EMBEDDED
    records = meta["gate table"].records
    assert [r.data["gate"] for r in records] == list(gates)
    assert not [v for r in records for v in r.data.values() if REPRS.search(str(v))]
    # Invoked directly, the checked table's family names it.
    direct = registration_gates(None, protocol=ProtocolResource(registration_dir=str(tmp_path)),
                                registration_record=gates_table(gates, "qwen2.5-7b"))
    assert direct.description.startswith("qwen2.5-7b: ") and direct.metadata["family"].value == "qwen2.5-7b"


def test_summary_when_every_gate_passes():
    gates = {"a (1)": {"passed": True, "numbers": {}, "message": "ok"}}
    assert gates_summary(gates, "fam") == "fam: all 1 gates passed"
    assert gate_rows(gates).iloc[0].numbers == "none"


def test_metadata_values_read_as_words_and_formatted_numbers():
    meta = named_metadata(None, {"flag": True, "np flag": np.bool_(False), "missing": None, "nan": float("nan"),
                                 "rate": 0.123456, "count": np.int64(3), "mapping": {"a": 1, "b": None},
                                 "list": [1, 2]})
    assert meta == {"flag": "yes", "np flag": "no", "missing": "n/a", "nan": "n/a", "rate": "0.123", "count": 3,
                    "mapping": "a: 1; b: n/a", "list": "1, 2"}
    assert readable_value(dg.MetadataValue.md("x")) == dg.MetadataValue.md("x")


def _scores() -> pd.DataFrame:
    """Scored rows of four blocks as ``trial_scores.assemble`` leaves them: only the primary
    block carries a Delta (reports); the others are read by forced choice, features or not at
    all (the baseline every Delta subtracts)."""
    nan = float("nan")
    rows = []
    for block, kind, delta, p1, feature in (("pilot_primary", "agent", 0.5, 0.6, 0),
                                            ("pilot_content_removed", "agent", nan, 0.5, -1),
                                            ("pilot_probe_other_option", "agent", nan, nan, 1),
                                            ("pilot_baseline", "baseline", nan, nan, -1)):
        rows += [{"block": block, "block_kind": kind, "delta": delta, "delta_recall": delta, "p_option1": p1,
                  "feature_row": feature, "choice_logprobs": ""}] * 2
    return pd.DataFrame(rows)


def test_mean_delta_by_block_says_what_scored_a_block_without_a_delta():
    summary = block_summary(_scores()).set_index("block")
    assert summary.loc["pilot_primary", "mean Delta"] == "0.500"
    assert summary.loc["pilot_content_removed", "mean Delta"] == "n/a (block scored by forced choice)"
    assert summary.loc["pilot_probe_other_option", "mean Delta"] == (
        "n/a (block scored by residual-stream features (the probe))")
    assert summary.loc["pilot_baseline", "mean Delta"] == "n/a (the baseline every Delta subtracts)"
    assert not [c for c in _cells(summary.reset_index()) if REPRS.search(c)]


def test_resume_progress_is_one_row_per_reader():
    table = resume_summary({"tested": {"documents": 1300, "documents/s": 2.5, "ETA s": None},
                            "judge": {"documents": 13, "documents/s": 0.25, "ETA s": 12.0}})
    assert list(table["reader"]) == ["tested", "judge"]
    assert table.iloc[0].to_dict() == {"reader": "tested", "documents": "1,300", "documents/s": "2.500",
                                       "ETA s": "n/a"}


def test_the_power_check_counts_targets_not_computable_as_the_record_does(tmp_path):
    """The demo's power summary: 6 met, 4 missed, 9 not computable. The check's numbers add up
    to its 19 targets and agree with the record's power row."""
    from fear_assets.defs.assets.registration.power import power_targets_met

    met = pd.array([True] * 6 + [False] * 4 + [None] * 9, dtype="boolean")
    table = pd.DataFrame({"target": [f"t{i}" for i in range(19)], "frames": 5, "met": met, "demo": True,
                          "family": EMBEDDED})
    result = power_targets_met(None, protocol=ProtocolResource(registration_dir=str(tmp_path)), power_summary=table)
    assert not result.passed
    meta = {k: getattr(v, "value", v) for k, v in result.metadata.items()}
    assert (meta["targets met"], meta["targets missed"], meta["targets not computable"]) == (6, 4, 9)
    assert result.description.startswith(f"{EMBEDDED}: targets: 4 missed and 9 not computable of 19")
    assert meta["demo (not registered)"] == "yes" and not REPRS.search(result.description)
