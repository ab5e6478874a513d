"""The registered code hash covers every package that decides a gate, a label or a reading."""

from __future__ import annotations

import shutil

import pytest

from fear_assets.registration.record import ANALYSIS_CODE, PACKAGE_ROOT, analysis_code_sha256


@pytest.mark.parametrize("module", ["registration/gates.py", "reading/inputs.py", "reading/decision.py",
                                    "pilot/depth_rules.py", "pilot/matching.py", "analysis/gate_b.py",
                                    "simulation/targets.py"])
def test_editing_a_rule_changes_the_registered_hash(tmp_path, module):
    root = tmp_path / "fear_assets"
    for pkg in ANALYSIS_CODE:
        shutil.copytree(PACKAGE_ROOT / pkg, root / pkg)
    before = analysis_code_sha256(root)
    assert before == analysis_code_sha256(PACKAGE_ROOT)
    path = root / module
    path.write_text(path.read_text(encoding="utf-8").replace(">=", ">", 1) + "\n# edited\n", encoding="utf-8")
    assert analysis_code_sha256(root) != before
