"""Estimation-only declarations honoured downstream, and H4's rules as flags, not stops
(protocol 6.1, 6.2, 6.3, 8; D5 row 12, D7). Each test simulates the case that would break
the protocol's sentence: a declaration made before collection that a later step could
ignore, or an H4 rule that could stop H2, H5 or the reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd

import fear_assets
from fear_assets.analysis.h4 import h4_flags
from fear_assets.defs.assets.analysis import posteriors_converged
from fear_assets.defs.assets.probes import at_chance
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.probes.carriage import h4_interpretable, interval
from fear_assets.analysis.estimands import h4_estimand_row
from fear_assets.reading.inputs import reading_inputs
from fear_assets.registration.gates import registration_status
from fear_assets.registration.pilot_gates import probe_rules_gate
from fear_assets.core.settings import PROJECT_ROOT, load_settings
from fear_assets.simulation.runner import LABEL_COLUMNS
from fear_assets.simulation.targets import HYPOTHESES, PowerTargets, decide, frame_sequence

# The label of a hypothesis declared estimation-only (D5 row 12's "estimation-only").
ESTIMATION_ONLY = "estimation_only"
# Functions that the corrections add are imported inside the tests, after each test's first
# behavioural assertion, so that on the code before the correction the test fails on that
# assertion (the behaviour) rather than on an import.

GATES = {"gate_a": "gate_a_service_relevance_H2", "gate_b": "gate_b_recall_H2",
         "gate_c": "gate_c_judge_H2_difference"}
CONTROLS = ("control_addressee_name", "control_instructed_interaction", "control_instructed_priority",
            "control_marked_priority")


def _power(**over) -> dict:
    """A complete, registered power result as power_summary stores it."""
    return {"demo": False, "status": "complete", "controls_to_strengthen": False, "gates_underpowered": False,
            "frames": 100, "frames_simulated": [100], "estimation_only": [], "joint_shortfall_source": None,
            "fits": 0, "fits_missing_convergence_rule": 0, "not_simulated": {}, "targets": [], **over}


def _record(**over) -> dict:
    record = {"family": "fam", "mode": "confirmatory", "status": "registered", "failed_gates": [], "gates": {},
              "binding_in_context": {"passed": True, "correct": 38, "documents": 40, "message": "ok"},
              "power": _power(), "h4_pilot": {"ran": True, "interpretable": True, "estimation_only": False}}
    record.update(over)
    return record


def _estimand(contrast: str, kind: str, label: str, mean: float = 0.4, low: float = 0.2, high: float = 0.6,
              **over) -> dict:
    return {"contrast": contrast, "kind": kind, "status": "estimated", "mean": mean, "hdi_low": low,
            "hdi_high": high, "label": label, "practically_meaningful": low > 0.15, "control_passed": np.nan,
            "rhat": 1.001, "ess_bulk": 900.0, "ess_tail": 800.0, "divergences": 0, "convergence_problems": "",
            "note": "", **over}


def _posteriors(h2: str = "supported", h5: str = "supported", h4_row: dict | None = None) -> pd.DataFrame:
    """H2 and H5 with the given labels, every gate Supported, every control passing."""
    rows = [_estimand("H2", "confirmatory", h2), _estimand("H5", "confirmatory", h5),
            *(_estimand(name, "gate", "supported") for name in GATES.values()),
            *(_estimand(c, "control", "passes", control_passed=True) for c in CONTROLS)]
    if h4_row is not None:
        rows.append(h4_row)
    return pd.DataFrame(rows)


def _reading(posteriors: pd.DataFrame, record: dict):
    args = reading_inputs(posteriors, record)
    args.pop("in_context")
    return args, fear_assets.section8_reading(**args)


# -- item 2: an estimation-only declaration is honoured downstream ------------------------------
def test_record_with_h5_estimation_only_and_a_supported_h5_posterior_gives_row_12():
    """6.3 / D5 row 12: an H5 declared estimation-only before collection never enters the
    reading as Supported, even when its posterior would read Supported."""
    record = _record(power=_power(estimation_only=["H5"], h5_estimation_only=True))
    table = _posteriors(h2="supported", h5="supported")
    # The same data without the declaration read row 10, so the declaration is what moves it.
    assert _reading(table, _record())[1].row == 10
    args, reading = _reading(table, record)
    assert args["h5"] == ESTIMATION_ONLY
    assert reading.row == 12 and reading.code == "SELF_THREAT_WEIGHT_USE_UNRESOLVED_OR_NOT_TESTED"
    # With H2 Practically equivalent, an estimation-only H5 is not "H5 Supported" (row 5) either.
    assert _reading(_posteriors(h2="practically_equivalent"), record)[1].row == 6
    # The estimand keeps its interval but is labelled estimation-only (and so no later step reads it).
    from fear_assets.registration.gates import declared_estimation_only
    from fear_assets.analysis.estimands import apply_estimation_only

    relabelled = apply_estimation_only(table, declared_estimation_only(record)).set_index("contrast")
    assert relabelled.loc["H5", "label"] == ESTIMATION_ONLY and not relabelled.loc["H5", "practically_meaningful"]
    assert (relabelled.loc["H5", "hdi_low"], relabelled.loc["H5", "hdi_high"]) == (0.2, 0.6)
    assert relabelled.loc["H2", "label"] == "supported"
    from fear_assets.reading.inputs import reading_flags

    flags = reading_flags(reading, args, relabelled.reset_index().assign(failed_gates=""))
    assert any(f.startswith("estimation-only") and "H5" in f for f in flags)
    # An estimation-only H2 is never Supported either: no reading, reported as inconclusive (row 3).
    h2_only = _reading(table, _record(power=_power(estimation_only=["H2"])))[1]
    assert h2_only.row == 3 and any("estimation-only" in q for q in h2_only.qualifiers)
    # A reduced demo's list decides nothing (as for gates_underpowered).
    assert declared_estimation_only(_record(power=_power(estimation_only=["H5"], demo=True))) == {}


def _power_labels(frames: list[int], n: int, h5_null_equivalent: int) -> pd.DataFrame:
    """Stored power labels at each frame count: every target met with room to spare except
    H5's equivalence target at zero (``h5_null_equivalent`` of ``n`` Practically equivalent,
    the rest Unresolved, so never Supported at zero)."""
    rows = []

    def add(frame, scenario, contrast, labels, passed=None):
        for i, lab in enumerate(labels):
            rows.append({"family": "f", "scenario": scenario, "frames": frame, "dataset": i, "contrast": contrast,
                         "truth": 0.0, "mean": 0.0, "hdi_low": 0.0, "hdi_high": 0.0, "label": lab,
                         "practically_meaningful": False, "control_passed": passed, "rhat": 1.0,
                         "ess_bulk": 500.0, "ess_tail": 500.0, "divergences": 0, "converged": True,
                         "convergence_problems": "", "fit_seconds": 1.0})

    for f in frames:
        for c in (*HYPOTHESES, *GATES):
            add(f, "meaningful", c, ["supported"] * n)
            null = ["practically_equivalent"] * (h5_null_equivalent if c == "H5" else n)
            add(f, "null", c, null + ["unresolved"] * (n - len(null)))
        for c in CONTROLS:
            for scenario in ("meaningful", "null"):
                add(f, scenario, c, ["supported"] * n, passed=True)
    return pd.DataFrame(rows, columns=LABEL_COLUMNS)


def test_h5_missing_only_its_equivalence_target_at_100_frames_is_declared_estimation_only(settings):
    """6.3: "any hypothesis still below target is declared estimation-only before
    collection"; for H5's equivalence target this is stated in advance, whether or not H5 is
    the traced source of a joint shortfall (here the joint target is met, so it is not)."""
    t = PowerTargets.from_settings(settings)
    frames = frame_sequence(t)
    n = 20
    below = int(np.ceil(t.equivalent_at_zero_min * n)) - 1  # one dataset short of the registered bound
    labels = _power_labels(frames, n, below)
    d = decide(labels, t)
    assert d["frames"] == t.frames_max  # frames were added up to the last block
    h5_equivalence = [r for r in d["targets"] if r["target"] == "H5 Practically equivalent at zero"
                      and r["frames"] == t.frames_max][0]
    assert h5_equivalence["met"] is False
    assert d["joint_shortfall_source"] is None  # H5 is not the traced source
    assert d["estimation_only"] == ["H5"]
    assert d["h5_estimation_only"] is True
    # The joint target is then read for "use unresolved or not tested" (6.3, stated in advance).
    joint = [r for r in d["targets"] if r["contrast"] == "joint" and r["target"].endswith("(H5 estimation-only)")]
    assert {r["statistic"] for r in joint} == {"SELF_THREAT_WEIGHT_USE_UNRESOLVED_OR_NOT_TESTED"}
    assert [r["met"] for r in joint if r["scenario"] == "meaningful"] == [True]
    # At the registered bound itself H5 is not estimation-only.
    met = decide(_power_labels(frames[:1], n, below + 1), t)
    assert not met["h5_estimation_only"] and met["estimation_only"] == []
    # ... and the reading honours the declaration (row 12 from a Supported H5 posterior).
    record = _record(power=_power(**{k: d[k] for k in ("estimation_only", "h5_estimation_only")}))
    assert _reading(_posteriors(), record)[1].row == 12


# -- item 3: H4's rules are flags on H4's row, never stops --------------------------------------
def _pilot_probe_controls(settings, band_accuracy: float, control_correct: int, n: int = 400) -> pd.DataFrame:
    """The pilot_probe_controls table: the probe and one control probe (``control_correct``
    of ``n`` right, its registered interval), with the 6.3 pilot rules as ``pilot_probes``
    assigns them (ceiling: the registered accuracy)."""
    ceiling = settings.probe.ceiling_accuracy
    rows = []
    for name, k in (("probe", n), ("depth", control_correct)):
        lo, hi = interval(k, n, settings.probe.control_interval)
        rows.append({"probe": name, "correct": k, "n": n, "accuracy": k / n, "interval_low": lo,
                     "interval_high": hi, "excludes_chance": bool(lo > 0.5 or hi < 0.5)})
    ctrl = pd.DataFrame(rows)
    return ctrl.assign(family="fam", frame_set="pilot", h4_interpretable=h4_interpretable(ctrl),
                       decodes_at_shallowest=True, band_mean_accuracy=band_accuracy,
                       h4_estimation_only=band_accuracy > ceiling, band_depths="2,3")


def _h4_posterior_row(label: str, flags: list[str]) -> dict:
    return {"mean": 0.35, "hdi_low": 0.05, "hdi_high": 0.7, "label": label, "practically_meaningful": False,
            "max_rhat": 1.002, "min_ess_bulk": 800.0, "min_ess_tail": 700.0, "divergences": 0,
            "flags": "; ".join(flags)}


def test_a_pilot_ceiling_still_registers_and_h4s_confirmatory_row_says_estimation_only(settings):
    """6.1: a ceiling "declares H4 estimation-only before collection"; it is not a reason to
    refuse the registration, and the declaration reaches H4's confirmatory row."""
    ceiling = settings.probe.ceiling_accuracy
    pilot = _pilot_probe_controls(settings, band_accuracy=min(1.0, ceiling + 0.04), control_correct=200)
    gate = probe_rules_gate(pilot)
    failed = [] if gate["passed"] else ["probe rules (6.1)"]
    assert registration_status("confirmatory", failed) == "registered"
    from fear_assets.analysis.h4 import h4_declared, h4_label
    from fear_assets.registration.gates import declared_estimation_only
    from fear_assets.registration.pilot_gates import h4_pilot_declarations

    record = _record(h4_pilot=h4_pilot_declarations(pilot))
    assert record["h4_pilot"]["estimation_only"] is True
    # The confirmatory probe's table has no ceiling column: the declaration comes from the record.
    confirmatory = _pilot_probe_controls(settings, 0.8, 200).drop(
        columns=["h4_estimation_only", "band_mean_accuracy", "decodes_at_shallowest", "band_depths"]).assign(
        frame_set="confirmatory")
    interpretable, estimation_only = h4_declared(confirmatory, record)
    assert interpretable and estimation_only
    conv = settings.convergence
    diagnostics = {"max_rhat": 1.002, "min_ess_bulk": 800.0, "min_ess_tail": 700.0, "divergences": 0}
    flags = h4_flags(diagnostics, conv, interpretable, estimation_only, "confirmatory", 50)
    row = h4_estimand_row(_h4_posterior_row(h4_label("supported", interpretable, estimation_only), flags))
    assert row["label"] == ESTIMATION_ONLY and "estimation-only" in row["note"]
    # Below the ceiling nothing is declared and the rule's label stands.
    below = _record(h4_pilot=h4_pilot_declarations(_pilot_probe_controls(settings, ceiling - 0.05, 200)))
    assert h4_label("supported", *h4_declared(confirmatory, below)) == "supported"
    # H4 still below its own power targets is declared estimation-only too (6.3).
    assert h4_declared(confirmatory, {**below, "power": _power(estimation_only=["H4"])})[1]
    # The record's declaration also labels the H4 estimand itself estimation-only.
    assert "H4" in declared_estimation_only(record)


def test_a_failing_control_probe_marks_h4_uninterpretable_and_the_reading_is_unchanged(settings):
    """6.1: a control probe off chance declares H4 uninterpretable; 6.2: H4 never changes the
    reading. The failing control and a non-converged H4 fit are flags on H4's row: neither
    the control-probe check nor the convergence check stops anything downstream."""
    leaking = _pilot_probe_controls(settings, 0.8, control_correct=300).assign(frame_set="confirmatory")
    check = at_chance(leaking)
    assert not check.passed and check.severity.name == "WARN"  # reported, and not an ERROR that stops a run
    from fear_assets.analysis.h4 import UNINTERPRETABLE, h4_declared, h4_label
    from fear_assets.registration.pilot_gates import h4_pilot_declarations

    interpretable, estimation_only = h4_declared(leaking, _record())
    assert not interpretable and not estimation_only
    not_converged = {"max_rhat": 1.08, "min_ess_bulk": 40.0, "min_ess_tail": 30.0, "divergences": 12}
    flags = h4_flags(not_converged, settings.convergence, interpretable, estimation_only, "confirmatory", 50)
    h4 = h4_estimand_row(_h4_posterior_row(h4_label("supported", interpretable, estimation_only), flags))
    assert h4["label"] == UNINTERPRETABLE and h4["convergence_problems"]
    # A pilot control off chance (carried by the record) declares it uninterpretable too.
    pilot_leak = h4_pilot_declarations(_pilot_probe_controls(settings, 0.8, control_correct=300))
    assert pilot_leak["interpretable"] is False and probe_rules_gate(
        _pilot_probe_controls(settings, 0.8, control_correct=300))["passed"]
    assert not h4_declared(leaking.iloc[:1], _record(h4_pilot=pilot_leak))[0]
    # The reading is the same with and without H4's row, and H4 does not fail the convergence check.
    record = _record()
    with_h4, without_h4 = _posteriors(h4_row=h4), _posteriors()
    assert _reading(with_h4, record)[1] == _reading(without_h4, record)[1]
    assert _reading(with_h4, record)[1].row == 10
    result = posteriors_converged(None, protocol=ProtocolResource(), posteriors=with_h4)
    assert result.severity.name == "WARN" and "H4" in result.description


# -- confirmatory mode through Dagster: a failing gate blocks; H4's flags do not ---------------
_CONFIRMATORY_RUN = textwrap.dedent('''
    """Run in a workspace where the family's registration record is issued (confirmatory
    mode: its gates' failures are ERRORs, so the blocking ones stop what is downstream; the
    registered settings are not edited). Real checks and the real reading asset; the
    assets upstream of the reading are stand-ins with the real keys and the real edges
    (asserted below), producing fixed tables through the real H4 and reading functions, so
    that no model is fitted."""
    import json, sys
    import dagster as dg
    import duckdb
    import numpy as np
    import pandas as pd
    from fear_assets.analysis.h4 import h4_declared, h4_flags, h4_label
    from fear_assets.defs.assets.reading import section8_reading
    from fear_assets.defs.definitions import all_checks, defs, resources
    from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
    from fear_assets.probes.carriage import h4_interpretable, interval
    from fear_assets.registration.gates import declared_estimation_only
    from fear_assets.analysis.estimands import apply_estimation_only, h4_estimand_row
    from fear_assets.defs.resources.store import SCHEMA
    from fear_assets.core.settings import load_settings

    SETTINGS = load_settings()
    FAMILY = sys.argv[2]
    REGISTRATION = sys.argv[4]
    CASE = {}  # the case being run (one materialisation per case, each in its own instance and store)
    KEYS = ("registration_record", "probe_controls", "h4_posterior", "posteriors", "section8_reading")
    GATES = ("gate_a_service_relevance_H2", "gate_b_recall_H2", "gate_c_judge_H2_difference")
    CONTROLS = ("control_addressee_name", "control_instructed_interaction", "control_instructed_priority",
                "control_marked_priority")
    common = dict(partitions_def=family_partitions, metadata=FAMILY_EXPR)

    @dg.asset(name="registration_record", **common)
    def registration_record():
        record = {"family": FAMILY, "mode": "confirmatory", "status": "registered" if CASE["gate_passes"] else "refused",
                  "failed_gates": [] if CASE["gate_passes"] else ["binding single-sentence (4.2)"],
                  "binding_in_context": {"passed": True, "correct": 38, "documents": 40, "message": "ok"},
                  "power": None, "h4_pilot": {"ran": True, "interpretable": True, "estimation_only": False}}
        return pd.DataFrame([{"family": FAMILY, "gate": "binding single-sentence (4.2)",
                              "passed": CASE["gate_passes"], "numbers": "{}",
                              "message": "ok" if CASE["gate_passes"] else "write 1 frame(s) for termination",
                              "record_json": json.dumps(record)}])

    @dg.asset(name="probe_controls", **common)
    def probe_controls():
        rows = []
        for name, k in (("probe", 400), ("depth", CASE["control_correct"])):
            lo, hi = interval(k, 400, SETTINGS.probe.control_interval)
            rows.append({"family": FAMILY, "frame_set": "confirmatory", "probe": name, "correct": k, "n": 400,
                         "accuracy": k / 400, "interval_low": lo, "interval_high": hi,
                         "excludes_chance": bool(lo > 0.5 or hi < 0.5)})
        ctrl = pd.DataFrame(rows)
        return ctrl.assign(h4_interpretable=h4_interpretable(ctrl))

    @dg.asset(name="h4_posterior", **common)
    def h4_posterior(probe_controls: pd.DataFrame, registration_record: pd.DataFrame):
        record = json.loads(registration_record["record_json"].iloc[0])
        interpretable, estimation_only = h4_declared(probe_controls, record)
        diag = CASE["h4_diagnostics"]
        flags = h4_flags(diag, SETTINGS.convergence, interpretable, estimation_only, "confirmatory", 50)
        return pd.DataFrame([{"family": FAMILY, "frame_set": "confirmatory", "hypothesis": "H4", "mean": 0.3,
                              "hdi_low": 0.05, "hdi_high": 0.6, "label": h4_label("supported", interpretable,
                                                                                   estimation_only),
                              "practically_meaningful": False, **diag, "flags": "; ".join(flags)}])

    @dg.asset(name="posteriors", **common)
    def posteriors(h4_posterior: pd.DataFrame, registration_record: pd.DataFrame):
        record = json.loads(registration_record["record_json"].iloc[0])
        def row(contrast, kind, label, passed=np.nan):
            return {"contrast": contrast, "kind": kind, "status": "estimated", "mean": 0.4, "hdi_low": 0.2,
                    "hdi_high": 0.6, "label": label, "practically_meaningful": True, "control_passed": passed,
                    "rhat": 1.001, "ess_bulk": 900.0, "ess_tail": 800.0, "divergences": 0.0,
                    "convergence_problems": "", "note": ""}
        rows = [row("H2", "confirmatory", "supported"), row("H5", "confirmatory", "supported"),
                *(row(g, "gate", "supported") for g in GATES), *(row(c, "control", "passes", 1.0) for c in CONTROLS),
                h4_estimand_row(h4_posterior.iloc[0])]
        table = apply_estimation_only(pd.DataFrame(rows), declared_estimation_only(record))
        table["divergences"] = table["divergences"].astype(float)
        table["practically_meaningful"] = table["practically_meaningful"].astype(bool)
        return table.assign(family=FAMILY, failed_gates="")

    standins = [registration_record, probe_controls, h4_posterior, posteriors]
    # The stand-ins keep the real edges between these assets.
    real = {k: defs.resolve_assets_def(k) for k in KEYS}
    for a in [*standins, section8_reading]:
        key = a.key
        want = {d.to_user_string() for d in real[key.to_user_string()].asset_deps[key]} & set(KEYS)
        have = {d.to_user_string() for d in a.asset_deps[key]}
        assert want == have, (key, want, have)
    checks = [c for c in all_checks if c.check_key.name in
              ("registration_gates", "controls_at_chance", "h4_converged", "posteriors_converged")]
    results = []
    for i, case in enumerate(json.loads(sys.argv[3])):
        CASE.clear()
        CASE.update(case)
        db = f"{sys.argv[1]}.{i}.duckdb"
        with dg.instance_for_test() as instance:
            run = dg.materialize([*standins, section8_reading, *checks], partition_key=FAMILY, instance=instance,
                                 resources=resources(db, registration_dir=REGISTRATION), raise_on_error=False)
        out = {"mode": resources(db, registration_dir=REGISTRATION)["protocol"].mode(FAMILY),
               "materialised": sorted(e.asset_key.to_user_string() for e in run.get_asset_materialization_events()),
               "checks": {e.check_name: [e.passed, e.severity.name] for e in run.get_asset_check_evaluations()},
               "failed_steps": sorted(e.step_key for e in run.all_events if e.is_step_failure)}
        if "section8_reading" in out["materialised"]:
            with duckdb.connect(db, read_only=True) as con:
                out["reading"] = con.execute(f"select code, row, h2, h5 from {SCHEMA}.section8_reading").fetchone()
                out["h4_label"] = con.execute(
                    f"select label from {SCHEMA}.posteriors where contrast = 'H4'").fetchone()[0]
        results.append(out)
    print(json.dumps(results))
''')


def _confirmatory_runs(tmp_path, *cases: dict) -> list[dict]:
    from fear_assets.stimuli.bank import load_bank
    from fear_assets_tests.issued import register

    settings = load_settings()
    family = next(iter(settings.families))
    registration = tmp_path / "registration"
    register(registration, family, settings, load_bank(settings=settings))  # fear register: A is registered
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("FEAR_ASSETS_SETTINGS", None)
    out = subprocess.run([sys.executable, "-c", _CONFIRMATORY_RUN, str(home / "store"), family,
                          json.dumps(list(cases)), str(registration)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_confirmatory_mode_a_failing_gate_blocks_its_downstream_and_h4s_flags_do_not(tmp_path, settings):
    """Confirmatory mode (the family's record issued), real Dagster materialisations: (1) a failing registration gate (a
    blocking check) stops everything downstream of the record in the same run: no posteriors,
    no reading; (2) with the record registered, a control probe off chance and a non-converged
    H4 fit fail their checks as warnings, H4's row says uninterpretable, and posteriors (H2,
    H5) and the Section 8 reading still materialise, with the reading H2, H5 and the gates give."""
    converged = {"max_rhat": 1.002, "min_ess_bulk": 800.0, "min_ess_tail": 700.0, "divergences": 0.0}
    not_converged = {"max_rhat": 1.08, "min_ess_bulk": 40.0, "min_ess_tail": 30.0, "divergences": 12.0}
    blocked, flagged = _confirmatory_runs(
        tmp_path, {"gate_passes": False, "control_correct": 200, "h4_diagnostics": converged},
        {"gate_passes": True, "control_correct": 300, "h4_diagnostics": not_converged})
    assert blocked["mode"] == "confirmatory"  # the family's record is issued: its gates block
    assert blocked["checks"]["registration_gates"] == [False, "ERROR"]
    assert blocked["checks"]["registration_gates"][0] is False
    assert "posteriors" not in blocked["materialised"] and "section8_reading" not in blocked["materialised"]
    assert "registration_record" in blocked["materialised"]
    assert flagged["checks"]["controls_at_chance"] == [False, "WARN"]
    assert flagged["checks"]["h4_converged"] == [False, "WARN"]
    assert flagged["checks"]["posteriors_converged"][1] == "WARN"
    assert {"h4_posterior", "posteriors", "section8_reading"} <= set(flagged["materialised"])
    assert flagged["failed_steps"] == []
    assert flagged["h4_label"] == "uninterpretable"
    assert flagged["reading"] == ["CONSISTENT_WITH_FRAMEWORK", 10, "supported", "supported"]
