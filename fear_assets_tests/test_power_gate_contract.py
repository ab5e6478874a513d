"""The power gate's contract between power_summary (6.3) and the registration record and
reading: only the registered simulation's complete result decides anything."""

from __future__ import annotations

import pytest

from fear_assets.reading.inputs import gates_underpowered
from fear_assets.registration.gates import power_gate, registered_power_result

COMPLETE = {"demo": False, "status": "complete", "gates_underpowered": True, "controls_to_strengthen": False}


@pytest.mark.parametrize("power, registered", [
    (None, False),
    (COMPLETE | {"demo": True}, False),
    (COMPLETE | {"status": "partial: 3 target(s) not computable (components not simulated)"}, False),
    (COMPLETE | {"status": "incomplete: simulate frame count 60"}, False),
    (COMPLETE, True),
])
def test_only_a_complete_registered_simulation_counts(power, registered):
    assert registered_power_result(power) is registered
    assert power_gate(power, "qwen2.5-7b")["passed"] is registered
    # the reading reads gates_underpowered only from a registered result; otherwise "not run"
    assert gates_underpowered({"family": "qwen2.5-7b", "power": power}) == (True if registered else None)


def test_demo_result_says_it_is_not_the_registered_simulation():
    gate = power_gate(COMPLETE | {"demo": True}, "smollm2-135m")
    assert "demo" in gate["message"] and "not the registered" in gate["message"]


def test_controls_shortfall_fails_the_power_gate():
    gate = power_gate(COMPLETE | {"controls_to_strengthen": True}, "qwen2.5-7b")
    assert not gate["passed"] and "strengthen" in gate["message"]


# 6.3: registration needs every target met; a target whose component was not simulated is not
# met. As read back from the store, "not computable" is a missing boolean, which a mask drops.
@pytest.mark.parametrize("stored", ["object", "boolean"])
def test_a_not_computable_target_counts_as_missed_however_it_is_stored(stored):
    import pandas as pd

    from fear_assets.simulation.steps import targets_missed

    summary = pd.DataFrame({"target": ["H2 power", "H5 power", "H1 false positives"],
                            "met": pd.Series([True, None, True], dtype=stored)})
    missed = targets_missed(summary)
    assert list(missed["target"]) == ["H5 power"]
    assert targets_missed(summary.assign(met=pd.Series([True, True, True], dtype=stored))).empty


# 6.3: "If any target is missed, confirmatory frames are added in blocks of 10 up to 100; any
# hypothesis still below target is declared estimation-only before collection." The gate judges
# the decided frame count by these rules, not every frame count tried.
def _short(labels, contrast: str, scenario: str = "meaningful", n: int = 10):
    labels = labels.copy()
    rows = (labels["contrast"] == contrast) & (labels["scenario"] == scenario) & (labels["dataset"] < n)
    if contrast.startswith("control_"):
        labels.loc[rows, ["label", "control_passed"]] = ["unresolved", False]
    else:
        labels.loc[rows, "label"] = "unresolved"
    return labels


def _gate(decision):
    import pandas as pd

    from fear_assets.simulation.steps import targets_missed

    return targets_missed(pd.DataFrame(decision["targets"]))


def test_a_frame_count_that_missed_and_was_followed_by_ten_more_frames_does_not_fail_the_gate():
    import pandas as pd

    from fear_assets.simulation.targets import decide
    from fear_assets_tests.test_power import _full, _t

    ok = _full([("supported", 19), ("unresolved", 1)])
    labels = pd.concat([_short(ok, "H3"), ok.assign(frames=60)], ignore_index=True)
    d = decide(labels, _t(frames_max=70))
    assert d["frames"] == 60 and d["passed"]
    assert any(r["frames"] == 50 and r["met"] is False for r in d["targets"])  # the history is kept
    assert _gate(d).empty
    # Before 60 frames are simulated, the missed 50-frame targets fail it.
    waiting = decide(_short(ok, "H3"), _t(frames_max=70))
    assert waiting["frames"] is None and not _gate(waiting).empty


def test_a_hypothesis_still_short_at_the_last_frame_count_is_estimation_only_not_a_failure():
    from fear_assets.simulation.targets import decide
    from fear_assets_tests.test_power import _full, _t

    ok = _full([("supported", 19), ("unresolved", 1)])
    d = decide(_short(ok, "H3"), _t(frames_max=50))
    assert d["frames"] == 50 and d["estimation_only"] == ["H3"]
    assert _gate(d).empty


def test_a_joint_shortfall_traced_to_the_controls_still_fails_the_gate():
    from fear_assets.registration.gates import power_gate
    from fear_assets.simulation.targets import decide
    from fear_assets_tests.test_power import CONTROLS, _full, _t

    ok = _full([("supported", 19), ("unresolved", 1)])
    d = decide(_short(ok, CONTROLS[0]), _t(frames_max=50))
    assert d["joint_shortfall_source"] == "controls"
    missed = _gate(d)
    assert not missed.empty and set(missed["contrast"]) == {"joint"}
    assert not power_gate({**d, "demo": False}, "f")["passed"]  # the record's gate agrees


def test_a_summary_with_no_decided_frame_count_does_not_pass():
    # Every target met but none required (no frame count of the sequence decided yet): the
    # gate has judged nothing, so it must not pass.
    import pandas as pd

    from fear_assets.simulation.steps import power_targets_passed

    summary = pd.DataFrame({"target": ["H2 power"], "frames": [40], "met": [True], "required": [False]})
    assert not power_targets_passed(summary)
    assert power_targets_passed(summary.assign(required=True))
