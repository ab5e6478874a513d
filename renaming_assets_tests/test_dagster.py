"""Both code locations load from workspace.yaml; the renaming assets build the same bundle
as the command line."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

import renaming_assets.definitions as renaming
from renaming_assets.bundle import ARTIFACTS, FREEZE
from renaming_assets.resources import RenamingStudy
from renaming_assets.settings import FAMILIES

from renaming_assets_tests.conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent


def test_workspace_lists_both_code_locations_and_both_load():
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    modules = {e["python_module"]["location_name"]: e["python_module"]["module_name"] for e in workspace["load_from"]}
    assert modules == {"two_facts_one_gate": "fear_assets.defs.definitions",
                       "anchor_fixed_renaming": "renaming_assets.definitions"}
    import fear_assets.defs.definitions as fear

    for module in (fear, renaming):
        module.defs.validate_loadable(module.defs)
    keys = {k.to_user_string() for k in renaming.defs.resolve_all_asset_keys()}
    assert {"renaming_bundle", "renaming_audit", "renaming_freeze", "renaming_precision",
            "renaming_analysis"} <= keys
    spec = renaming.defs.resolve_assets_def("renaming_family_bodies").partitions_def
    assert spec.get_partition_keys() == list(FAMILIES)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_assets_build_the_command_line_bundle_and_analyze_config_logs(tmp_path, small_bundle, small_log):
    study = RenamingStudy(bundle_dir=str(tmp_path / "bundle"), reduced_worlds_per_family=SMALL.cohort.worlds_per_family)
    instance = dg.DagsterInstance.ephemeral()
    a = renaming.assets

    def run(selection, partition_key=None, **kw):
        return dg.materialize(renaming.all_assets, selection=selection, partition_key=partition_key,
                              instance=instance, resources={"study": study}, **kw)

    for family in FAMILIES:
        run([a.renaming_family_bodies], family)
    run([a.renaming_bundle])
    for family in FAMILIES:
        run([a.renaming_family_audit], family)
    run([a.renaming_audit, a.renaming_precision, a.renaming_freeze])
    for name in (*ARTIFACTS, FREEZE):
        assert _sha(tmp_path / "bundle" / name) == _sha(small_bundle / name), name
    result = run(
        [a.renaming_analysis],
        run_config={"ops": {"renaming_analysis": {"config": {"logs": [str(small_log)],
                                                              "out": str(tmp_path / "result.json")}}}})
    assert result.success
    assert (tmp_path / "result.json").read_text().splitlines()[0].startswith('{"evidence": "SYNTHETIC EVIDENCE')


@pytest.mark.slow
def test_dagster_cli_validates_both_code_locations():
    """What `dagster dev -w workspace.yaml` loads (the fast in-process counterpart is above)."""
    proc = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w",
                           "workspace.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DAGSTER_HOME": str(ROOT), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for location in ("two_facts_one_gate", "anchor_fixed_renaming"):
        assert f"Validation successful for code location {location}." in proc.stderr + proc.stdout
