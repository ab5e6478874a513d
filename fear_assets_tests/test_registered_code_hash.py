"""The registered code hash covers every package that decides a gate, a label or a reading."""

from __future__ import annotations

import shutil

import pytest

from fear_assets.registration.record import ANALYSIS_CODE, PACKAGE_ROOT, analysis_code_sha256


@pytest.mark.parametrize("module", ["registration/gates.py", "reading/inputs.py", "reading/decision.py",
                                    "pilot/depth_rules.py", "pilot/matching.py", "analysis/gate_b.py",
                                    "simulation/targets.py",
                                    # issue 12: the rules moved out of the asset layer
                                    "registration/pilot_gates.py",  # gate verdicts, final selection
                                    "analysis/h4.py",  # H4 data, fit and flags
                                    "analysis/controls.py",  # the pilot controls' verdict rows
                                    "analysis/unmasking.py",  # the one unmasking path
                                    "pilot/binding.py",  # in-context binding
                                    "probes/carriage.py", "probes/inputs.py",  # the probe rules (6.1, 6.3)
                                    "simulation/batches.py"])
def test_editing_a_rule_changes_the_registered_hash(tmp_path, module):
    root = tmp_path / "fear_assets"
    for pkg in ANALYSIS_CODE:
        shutil.copytree(PACKAGE_ROOT / pkg, root / pkg)
    before = analysis_code_sha256(root)
    assert before == analysis_code_sha256(PACKAGE_ROOT)
    path = root / module
    path.write_text(path.read_text(encoding="utf-8").replace(">=", ">", 1) + "\n# edited\n", encoding="utf-8")
    assert analysis_code_sha256(root) != before
