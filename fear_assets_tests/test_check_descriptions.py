"""Check descriptions quote the registered settings, not numbers restated as prose: a
changed registered value shows in the description built from it."""

import shutil

import pytest
import yaml

from fear_assets.analysis.pilot_controls import controls_description
from fear_assets.core.settings import DEFAULT_SETTINGS_PATH, load_settings
from fear_assets.pilot.binding import binding_gate_description
from fear_assets.pilot.matching import matching_gate_description
from fear_assets.pilot.report_scoring import scorer_agreement_description
from fear_assets.pilot.zero_preference import zero_preference_description
from fear_assets.probes.pilot_probe import pilot_probe_rules_description


def _edited(tmp_path, section: str, key: str, value):
    """The registered settings file with one value changed, loaded from a copy."""
    bank = DEFAULT_SETTINGS_PATH.parent / "bank"
    if bank.exists():
        shutil.copytree(bank, tmp_path / "bank")
    raw = yaml.safe_load(DEFAULT_SETTINGS_PATH.read_text(encoding="utf-8"))
    raw[section][key] = value
    path = tmp_path / "protocol_settings.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return load_settings(path)


@pytest.mark.parametrize("build, section, key, value, registered, edited", [
    (matching_gate_description, "matching", "tost_bound", 0.07, "+-0.05", "+-0.07"),
    (zero_preference_description, "zero_preference", "low", 0.35, "(0.4-0.6)", "(0.35-0.6)"),
    (binding_gate_description, "binding", "pass_rate_min", 0.85, ">= 90%", ">= 85%"),
    (scorer_agreement_description, "report_scoring", "kappa_min", 0.75, ">= 0.80", ">= 0.75"),
    (controls_description, "positive_controls", "pass_min_mean", 0.2, ">= 0.15", ">= 0.2"),
    (pilot_probe_rules_description, "probe", "ceiling_accuracy", 0.9, "(0.95)", "(0.9)"),
])
def test_a_check_description_follows_its_registered_value(tmp_path, build, section, key, value, registered, edited):
    assert registered in build(load_settings())
    text = build(_edited(tmp_path, section, key, value))
    assert edited in text and registered not in text
