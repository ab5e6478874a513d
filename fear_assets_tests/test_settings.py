from pathlib import Path

import pytest
import yaml

from fear_assets.core.errors import SettingsError
from fear_assets.core.settings import DEFAULT_SETTINGS_PATH, load_settings


def test_registered_numbers_are_in_the_settings(settings):
    assert settings.decision.sesoi == 0.15
    assert settings.decision.meaningful == 0.30
    assert settings.decision.rope == (-0.15, 0.15)  # typed section: an immutable pair
    assert settings.decision.hdi_prob == 0.99
    assert settings.matching.max_abs_difference == 0.10
    assert settings.matching.tost_bound == 0.05
    assert settings.zero_preference.as_written() == {"low": 0.4, "high": 0.6}
    assert settings.binding.pass_rate_min == 0.90
    assert settings.report_scoring.kappa_min == 0.80
    assert settings.exclusion.cell_flag_rate == 0.05
    assert settings.names[:5] == ("Orin", "Tavi", "Kemi", "Sora", "Pell")
    assert len(settings.names) == 12


def test_families_and_depth_sets_follow_decisions_1(settings):
    assert settings.family("qwen2.5-7b").depth_tokens == (0, 256, 512, 1024, 2048, 4096, 8192, 16384)
    assert settings.family("gemma-2-9b").depth_tokens == (0, 128, 256, 512, 1024, 2048, 4096, 6144)
    assert settings.family("llama-3.1-8b").scorer == "Qwen/Qwen2.5-7B-Instruct"
    assert settings.family("qwen2.5-7b").judge == "mistralai/Mistral-7B-Instruct-v0.3"
    embedded = settings.family("smollm2-135m")
    assert embedded.base is None and embedded.reduced_design is not None
    # The embedded demo registers a reduced design of three depths, the deepest thinned to one
    # name rotation (its time budget; issue 26).
    assert embedded.depth_keys == ("d1", "d2", "d3") and embedded.depth_tokens == (0, 128, 512)
    assert embedded.reduced_design.rotations_by_depth == {"d3": (1,)}
    assert embedded.rotations_at(3, settings.rotations) == (1,) and embedded.rotations_at(2, settings.rotations) == (1, 2, 3)
    assert not embedded.reduced_design.examine_reserves
    assert embedded.reduced_design.branches["pilot_content_removed"] == ("forced_choice",)


def test_hash_is_stable_and_ignores_layout(settings, tmp_path):
    text = DEFAULT_SETTINGS_PATH.read_text()
    other = tmp_path / "s.yaml"
    other.write_text("# a comment that does not change the registration\n" + text)
    assert load_settings(other).sha256 == settings.sha256


def _write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(DEFAULT_SETTINGS_PATH.read_text())
    mutate(raw)
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r["protocol"].update(mode="exploratory"), "mode"),
    (lambda r: r["decision"].update(rope=[0.15, -0.15]), "rope"),
    (lambda r: r["families"]["qwen2.5-7b"].update(depth_tokens=[0, 512, 256]), "depth_tokens"),
    (lambda r: r["design"]["blocks"][0].update(kind="everything"), "kind"),
    (lambda r: r.pop("priors"), "priors"),
    (lambda r: r["bank"]["function_words"].append(False), "function_words"),  # an unquoted `off`
    (lambda r: r["power"].update(scenarios=["meaningful", None]), "scenarios"),  # an unquoted `null`
    (lambda r: r["power"]["demo"]["sampler"].update(draws=0), "draws"),  # nested: power.demo.sampler
    (lambda r: r["power"].update(demo=5), "demo"),
    # a thinned depth the family does not have, a rotation that is not registered, no rotation
    (lambda r: r["families"]["smollm2-135m"]["reduced_design"].update(rotations_by_depth={"d4": [1]}), "d4"),
    (lambda r: r["families"]["smollm2-135m"]["reduced_design"].update(rotations_by_depth={"d3": [4]}), "d3"),
    (lambda r: r["families"]["smollm2-135m"]["reduced_design"].update(rotations_by_depth={"d3": []}), "d3"),
])
def test_bad_settings_name_file_field_and_fix(tmp_path, mutate, field):
    path = _write(tmp_path, mutate)
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert err.value.field == field
    assert str(path) in str(err.value) and "Fix:" in str(err.value)
