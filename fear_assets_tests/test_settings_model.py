"""The one typed settings model and its one validator: a copy of the registered file with one
field broken must fail to load, naming the file, the field and the fix (unknown keys at every
level, ROPE = +-SESOI, the depth band's minimum against every family, every named block list)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from fear_assets.core.errors import SettingsError
from fear_assets.core.hashing import sha256_obj
from fear_assets.core.registered import registered
from fear_assets.core.sections import SIMULATED_BLOCKS
from fear_assets.core.settings import (REGISTERED_SETTINGS_PATH, SETTINGS_ENV, definition_layout, load_settings,
                                       settings_path)
from fear_assets.simulation.generator import PRIMARY_MODEL_BLOCKS
from fear_assets.simulation.setup import sampler_of

TEXT = REGISTERED_SETTINGS_PATH.read_text(encoding="utf-8")

PRIMARY_BLOCK = ("{name: primary, frames: confirmatory, kind: agent, cells: primary, condition: default, "
                 "reader: tested}")


def _broken(tmp_path, old: str, new: str):
    """A copy of the registered settings with ``old`` replaced once by ``new``."""
    assert TEXT.count(old) >= 1, f"{old!r} is not in the registered file"
    path = tmp_path / "protocol_settings.yaml"
    path.write_text(TEXT.replace(old, new, 1), encoding="utf-8")
    return path


# (case, text replaced, replacement, item named, field named, words of the fix)
CASES = [
    ("unknown key at the top", "protocol:\n", "protcol: {}\nprotocol:\n", "<top>", "protcol",
     "did you mean 'protocol'?"),
    ("typo in a typed section", "  tost_alpha: 0.05", "  tost_alpha: 0.05\n  tost_alhpa: 0.05", "matching",
     "tost_alhpa", "did you mean 'tost_alpha'?"),
    ("typo in protocol", "  master_seed: 20261014\n", "  master_seed: 20261014\n  master_sed: 1\n", "protocol",
     "master_sed", "did you mean 'master_seed'?"),
    ("typo in a family", "    system_role: false\n", "    system_role: false\n    sytem_role: false\n",
     "families.gemma-2-9b", "sytem_role", "did you mean 'system_role'?"),
    ("typo in a reduced design", "      examine_reserves: false\n",
     "      examine_reserves: false\n      examine_reserve: false\n", "families.smollm2-135m.reduced_design",
     "examine_reserve", "did you mean 'examine_reserves'?"),
    ("typo in a block", PRIMARY_BLOCK, PRIMARY_BLOCK[:-1] + ", optoin: other}", "design.blocks[primary]",
     "optoin", "did you mean 'option'?"),
    ("typo in a design rule", "    option_when_odd: 2\n", "    option_when_odd: 2\n    option_when_od: 2\n",
     "design.option_rule", "option_when_od", "did you mean 'option_when_odd'?"),
    ("typo in the bank", "  events_per_class: 20\n", "  events_per_class: 20\n  event_per_class: 20\n", "bank",
     "event_per_class", "did you mean 'events_per_class'?"),
    ("typo in a nested section", "sampler: {draws: 100, tune: 100, chains: 2}",
     "sampler: {draws: 100, tune: 100, chains: 2, chain: 2}", "power.demo.sampler", "chain",
     "did you mean 'chains'?"),
    ("typo in a model entry", "google/gemma-2-9b: {dtype: bfloat16,", "google/gemma-2-9b: {dtyp: x, dtype: bfloat16,",
     "models.google/gemma-2-9b", "dtyp", "did you mean 'dtype'?"),
    ("rope is not +-sesoi", "rope: [-0.15, 0.15]", "rope: [-0.2, 0.2]", "decision", "rope",
     "write decision.rope as [-0.15, 0.15]"),
    # the embedded demo's three depths are the fewest any family has
    ("min_depths above a family's depths", "  min_depths: 2", "  min_depths: 4", "depth_band", "min_depths",
     "register at most 3"),
    ("unregistered scored block", "scored_blocks: [pilot_primary,", "scored_blocks: [pilot_primry,",
     "families.smollm2-135m.reduced_design", "scored_blocks", "did you mean 'pilot_primary'"),
    ("unregistered branch block", "        pilot_content_removed: [forced_choice]",
     "        pilot_content_remved: [forced_choice]", "families.smollm2-135m.reduced_design", "branches",
     "did you mean 'pilot_content_removed'"),
    ("unregistered control block", "  pilot_blocks: [pilot_control_addressee_name,",
     "  pilot_blocks: [pilot_control_adressee_name,", "positive_controls", "pilot_blocks",
     "did you mean 'pilot_control_addressee_name'"),
    ("unregistered demo block", "blocks: [primary, recall, service_relevance]",
     "blocks: [primary, recal, service_relevance]", "power.demo", "blocks", "a list of simulated blocks"),
    ("unknown simulation sampler", "  algorithm: adaptive_hmc_dense_pooled", "  algorithm: adaptive_hmc",
     "simulation_sampler", "algorithm", "one of ['adaptive_hmc_dense_pooled', 'chees_hmc', 'nuts']"),
    ("target acceptance of none", "  target_accept: 0.9", "  target_accept: 0", "simulation_sampler",
     "target_accept", "a number in (0.0, 1.0]"),
    ("negative chain floor", "  min_pooled_chains: 24", "  min_pooled_chains: -4", "simulation_sampler",
     "min_pooled_chains", "0 sets no floor"),
    ("one chain per simulated dataset", "  chains: 4\n  warmup:", "  chains: 1\n  warmup:", "simulation_sampler",
     "chains", "at least 2 chains"),
    ("typo in the simulation sampler", "  pilot_steps: 1000", "  pilot_steps: 1000\n  pilot_step: 10",
     "simulation_sampler", "pilot_step", "did you mean 'pilot_steps'?"),
]


@pytest.mark.parametrize("case, old, new, item, field, fix", CASES, ids=[c[0] for c in CASES])
def test_a_broken_field_names_file_item_field_and_fix(tmp_path, case, old, new, item, field, fix):
    path = _broken(tmp_path, old, new)
    with pytest.raises(SettingsError) as caught:
        load_settings(path)
    error = caught.value
    assert error.file == str(path)
    assert (error.item, error.field) == (item, field), str(error)
    assert fix in error.fix, str(error)


def test_the_registered_file_loads_typed_with_its_hash_unchanged():
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    # The hash is of the parsed mapping, as before the typed model (the frozen record compares it).
    assert settings.sha256 == sha256_obj(yaml.safe_load(TEXT))
    assert settings.decision.rope == (-settings.decision.sesoi, settings.decision.sesoi)
    assert settings.design.option_rule.option_when_even == 1 and settings.design.option_rule.option_when_odd == 2
    assert settings.design.confirmatory_frames_required == 50 and settings.bank.events_per_class == 20
    assert settings.models["google/gemma-2-9b"].attn_implementation == "eager"
    assert set(settings.tokenizers) == {"llama-3.1", "qwen2.5", "mistral-v0.3", "gemma-2"}
    assert settings.protocol.name == "two-facts-one-gate"


def test_no_string_key_reads_of_a_section():
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    with pytest.raises(TypeError):
        settings.decision["sesoi"]  # noqa: B018  (the shim is gone: read attributes)
    for gone in ("section", "bank_rules"):
        assert not hasattr(settings, gone)


def test_the_simulated_blocks_are_the_generators():
    assert set(SIMULATED_BLOCKS) == set(PRIMARY_MODEL_BLOCKS)


def test_the_power_sampler_is_typed_and_the_demos_for_the_embedded_family():
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    assert sampler_of(settings, "smollm2-135m") == settings.power.demo.sampler
    assert sampler_of(settings, "qwen2.5-7b") == settings.sampler == registered(settings, "qwen2.5-7b").power_sampler


def test_the_definition_layout_is_a_function_of_the_settings(tmp_path):
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    layout = definition_layout(settings)
    assert layout.families == tuple(settings.families)
    assert layout.max_depths == 8 and layout.depth_keys[-1] == "d8"
    # No mode in the layout: a family's mode comes from its issued record, at run time.
    assert not hasattr(layout, "gates_block")


def test_an_old_file_that_still_sets_the_mode_is_told_how_a_family_registers(tmp_path):
    """Registering used to be editing ``protocol.mode`` in the frozen file; an old file that
    still has the key gets an error that says the mode is no longer a setting and how a
    family becomes confirmatory."""
    for mode in ("pilot", "confirmatory"):
        old = _broken(tmp_path, "  master_seed: 20261014\n", f"  mode: {mode}\n  master_seed: 20261014\n")
        with pytest.raises(SettingsError) as err:
            load_settings(old)
        assert err.value.item == "protocol" and err.value.field == "mode" and str(old) in str(err.value)
        assert "mode is no longer a setting" in str(err.value)
        assert "fear register FAMILY --stage1-id ID --supplementary-note FILE" in err.value.fix


def test_settings_path_honours_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    assert settings_path() == REGISTERED_SETTINGS_PATH
    monkeypatch.setenv(SETTINGS_ENV, str(tmp_path / "other.yaml"))
    assert settings_path() == tmp_path / "other.yaml"


def test_the_partitions_and_the_resource_read_the_same_file(tmp_path):
    """A process pointed at a copy builds its partitions from that copy and has it as the
    resource default (the copy's other master seed shows which file the definitions read; it
    was a confirmatory copy before the mode left the settings)."""
    copy = _broken(tmp_path, "  master_seed: 20261014\n", "  master_seed: 20261015\n")
    code = ("from fear_assets.defs import partitions; from fear_assets.defs.resources.protocol import ProtocolResource; "
            "print(partitions.DEFINITION_SETTINGS.path, partitions.DEFINITION_SETTINGS.master_seed, "
            "ProtocolResource().settings_path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, SETTINGS_ENV: str(copy)}).stdout.split()
    assert out == [str(copy), "20261015", str(copy)]


def test_the_hashed_settings_hold_no_host_or_mode_content():
    """The freeze check compares registered content only: the hashed settings hold no mode
    (a family's record says it) and no host content (no absolute or home path, no device),
    so a host or a registration never changes the settings hash."""
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    assert "mode" not in settings.raw["protocol"]

    def walk(value, where):
        if isinstance(value, dict):
            for key, inner in value.items():
                assert str(key) not in ("mode", "device", "cache_dir", "local_dir"), f"{where}.{key}"
                walk(inner, f"{where}.{key}")
        elif isinstance(value, list):
            for i, inner in enumerate(value):
                walk(inner, f"{where}[{i}]")
        elif isinstance(value, str):
            assert not value.startswith(("/", "~", "./", "../")) and ":\\" not in value, f"{where}: {value!r}"

    walk(settings.raw, "<top>")
