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
