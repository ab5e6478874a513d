"""Two runs give byte-identical bundles; the command line writes the documented files."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from renaming_assets.bundle import ARTIFACTS, FREEZE, PLAN, build_bundle, write_plan
from renaming_assets.generator import generate_plan
from renaming_assets.settings import SETTINGS

from renaming_assets_tests.conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent
FILES = (*ARTIFACTS, FREEZE)


def _digests(bundle: Path) -> dict[str, str]:
    return {name: hashlib.sha256((bundle / name).read_bytes()).hexdigest() for name in FILES}


def test_reduced_bundle_is_byte_identical_across_runs(tmp_path, small_bundle):
    build_bundle(tmp_path / "again", SMALL)
    assert _digests(tmp_path / "again") == _digests(small_bundle)
    freeze = json.loads((small_bundle / FREEZE).read_text())
    assert freeze["artifacts"] == {name: _digests(small_bundle)[name] for name in ARTIFACTS}
    assert "generator/design.py" in freeze["sources"] and "PROTOCOL.txt" in freeze["sources"]


def test_full_plan_is_byte_identical_across_runs(tmp_path, full_bundle):
    """The registered plan regenerated in a fresh call equals the session bundle's bytes (the
    audit, precision and freeze files are deterministic functions of it; the slow test below
    rebuilds the whole registered bundle)."""
    write_plan(tmp_path, generate_plan(SETTINGS))
    assert _digests_one(tmp_path / PLAN) == _digests_one(full_bundle / PLAN)
    freeze = json.loads((full_bundle / FREEZE).read_text())
    assert freeze["artifacts"][PLAN] == _digests_one(full_bundle / PLAN)


def _digests_one(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_full_bundle_command_is_byte_identical_across_runs(tmp_path, full_bundle):
    proc = subprocess.run([sys.executable, "-m", "renaming_assets.bundle", str(tmp_path / "b")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert _digests(tmp_path / "b") == _digests(full_bundle)
