"""Issue 12: the asset graph in the protocol's stage order, typed settings sections, one
definition of each shared rule, and the registered code hash over every protocol rule."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from fear_assets.core.errors import SettingsError
from fear_assets.core.settings import DEFAULT_SETTINGS_PATH, DepthBand, depth_index, depth_key, load_settings

PACKAGE = Path(__file__).resolve().parent.parent / "fear_assets"
STAGES = ("stimuli", "pilot", "registration", "collection", "probes", "analysis", "reading")


# -- typed settings sections ------------------------------------------------------------
def test_typed_sections_read_by_attribute(settings):
    assert settings.matching.max_abs_difference == 0.10 and settings.matching.tost_alpha == 0.05
    assert (settings.zero_preference.low, settings.zero_preference.high) == (0.4, 0.6)
    assert settings.binding.single_sentence_checks_per_frame == 18
    assert settings.report_scoring.scorer_letters == ("Yes", "No")
    assert settings.depth_band_rule.min_depths == 2 and settings.h5_depth_rule.fallback_target == 0.75
    assert (settings.sampler.draws, settings.sampler.chains) == (500, 2)
    assert settings.convergence.rhat_max == 1.01 and settings.convergence.divergences_max == 0
    assert settings.generation.max_new_tokens == 48 and settings.probe.clip == (0.001, 0.999)
    assert settings.confirmatory_frames_per_fear("qwen2.5-7b") == 10
    assert settings.confirmatory_frames_per_fear("smollm2-135m") == 1  # the reduced design's


@pytest.mark.parametrize("section, field, value, says", [
    ("matching", "tost_alpha", 1.5, "a number in [0.0, 1.0]"),
    ("sampler", "chains", 0, "an integer >= 1"),
    ("sampler", "draws", 2.5, "an integer >= 1"),
    ("zero_preference", "low", 0.7, "not above low"),
    ("report_scoring", "scorer_letters", ["Yes"], "a list of two texts"),
    ("convergence", "rhat_max", 0.9, "R-hat is at least 1"),
    ("generation", "greedy", "yes", "true or false"),
])
def test_a_bad_field_names_the_file_section_field_and_fix(tmp_path, section, field, value, says):
    raw = yaml.safe_load(DEFAULT_SETTINGS_PATH.read_text())
    raw[section][field] = value
    path = tmp_path / "protocol_settings.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    message = str(err.value)
    assert str(path) in message and repr(section) in message and says in message and "Fix:" in message
    assert err.value.field == field or err.value.field == "high"


def test_the_agents_are_the_protocols(tmp_path):
    raw = yaml.safe_load(DEFAULT_SETTINGS_PATH.read_text())
    raw["design"]["agents"] = ["self", "person", "peer"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(SettingsError, match="design.agents"):
        load_settings(path)


def test_one_depth_key_conversion():
    assert [depth_key(i) for i in (1, 2, 10)] == ["d1", "d2", "d10"]
    assert [depth_index(k) for k in ("d1", "d10")] == [1, 10]
    for bad in ("D1", "d0", "1", "dx"):
        with pytest.raises(ValueError):
            depth_index(bad)
    with pytest.raises(ValueError):
        depth_key(0)


def test_the_depth_band_is_one_value_in_every_stored_form():
    # pilot_depths stores "1,3", the power estimates "d1,d3", the record [1, 3]: one value.
    band = DepthBand.of([1, 3])
    assert DepthBand.parse(band.stored) == DepthBand.parse(band.stored_keys) == band
    assert (band.stored, band.stored_keys, band.keys) == ("1,3", "d1,d3", ["d1", "d3"])
    for bad in ([3, 1], [1, 1], [0, 2]):  # a band is ascending depth indices without repeats
        with pytest.raises(ValueError):
            DepthBand.of(bad)


# -- one definition of each shared constant and rule ----------------------------------------
def _assignments(name: str) -> list[str]:
    out = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                out.append(str(path.relative_to(PACKAGE)))
    return out


def test_shared_constants_are_defined_once():
    assert _assignments("AGENTS") == ["core/settings.py"] and _assignments("CONTENTS") == ["core/settings.py"]
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    # The product reads special tokens from the tokenizer; only the registered tokenizers and
    # the rehearsal models (which write a checkpoint's published tokenizer config) name them.
    assert not [p for p, s in sources.items() if '"<|im_end|>"' in s and "registered_tokenizers" not in str(p)
                and p.parent.name != "rehearsal"]
    assert not [p for p, s in sources.items() if "def convergence_problems" in s and p.name != "fits.py"]
    assert not [p for p, s in sources.items() if "[[\"condition_code\", \"condition\"" in s
                and p.name != "unmasking.py"]


def test_the_bank_imports_no_design_module():
    """The cycle stimuli/bank.py <-> design/documents.py is broken: the bank loads alone."""
    code = "import sys, fear_assets.stimuli.bank; print(sorted(m for m in sys.modules if m.startswith('fear_assets.design')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "[]"


def test_end_of_turn_comes_from_the_tokenizer(smol_tokenizer):
    from fear_assets.lm.tokenizers import end_of_turn_ids

    ids = end_of_turn_ids(smol_tokenizer)
    assert smol_tokenizer.convert_tokens_to_ids("<|im_end|>") in ids and smol_tokenizer.eos_token_id in ids
    assert smol_tokenizer.unk_token_id not in ids


# -- the graph ---------------------------------------------------------------------------
def test_groups_are_the_stages_and_follow_the_protocol_order():
    from fear_assets.defs.definitions import STAGE_NAMES, defs

    assert STAGE_NAMES == STAGES
    graph = defs.resolve_asset_graph()
    group = {k: graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert set(group.values()) == set(STAGES)
    rank = {s: i for i, s in enumerate(STAGES)}
    for key in group:  # no asset reads from a later stage
        assert all(rank[group[p]] <= rank[group[key]] for p in graph.get(key).parent_keys), key
    assert group[dg.AssetKey("pilot_trial_table")] == "pilot"
    assert group[dg.AssetKey("confirmatory_trial_table")] == "collection"
    assert group[dg.AssetKey("power_summary")] == "registration"  # 6.3 gates registration


def test_a_re_registration_marks_the_confirmatory_design_stale():
    """registration_record is an asset input of the confirmatory trial table (no file read-back),
    and everything the analysis reads hangs below it."""
    from fear_assets.defs.definitions import defs

    graph = defs.resolve_asset_graph()
    record = dg.AssetKey("registration_record")
    assert record in graph.get(dg.AssetKey("confirmatory_trial_table")).parent_keys
    below = dg.AssetSelection.assets(record).downstream().resolve(graph)
    for name in ("confirmatory_trial_table", "confirmatory_scores", "probe_outputs", "h4_posterior", "posteriors",
                 "section8_reading"):
        assert dg.AssetKey(name) in below
    assert dg.AssetKey("pilot_trial_table") not in below
    source = (PACKAGE / "assets").rglob("*.py")
    assert not [p for p in source if "registered_replacements" in p.read_text(encoding="utf-8")]


def test_jobs_are_stage_jobs_and_the_main_plan_follows_the_stages():
    from fear_assets.defs.definitions import STAGE_NAMES, build_definitions
    from fear_assets.defs.main import plan

    defs = build_definitions(":memory:")
    names = {j.name for j in defs.get_repository_def().get_all_jobs()} - {"__ASSET_JOB"}
    assert names and all(n.split("_")[0] in STAGES and n.endswith("_job") for n in names)
    steps = plan(defs, STAGE_NAMES)
    order = [STAGES.index(s.stage) for s in steps]
    assert order == sorted(order) and steps[0].keys == (dg.AssetKey("frame_bank"),)
    # The last step reads across families: the cross-family statement and the Stage 2 report of all families.
    assert set(steps[-1].keys) == {dg.AssetKey("cross_family_statement"), dg.AssetKey("stage2_report_all")}
    planned = {k.to_user_string() for s in steps for k in s.keys}
    assert {"trial_accounting", "registration_record", "posteriors", "stage2_report", "data_record"} <= planned
    assert "name_candidates" not in planned


def test_asset_modules_are_thin():
    modules = list((PACKAGE / "defs" / "assets").rglob("*.py"))
    assert modules, "no asset modules found: the shell moved?"
    long = {str(p.relative_to(PACKAGE)): n for p in modules if (n := len(p.read_text().splitlines())) > 225}
    assert not long
    for path in modules:  # imports at the top (a stated reason is a noqa comment)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            inner = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not inner, f"{path.name}:{fn.name} imports inside its body"


def test_numbers_read_sensibly():
    from fear_assets.core.numbers import number

    # core.numbers' format: fixed decimals, exponent form when huge or tiny, n/a and yes/no.
    assert number(14462920.0, "value") == "1.4e7" and number(3.0104, "value") == "3.010"
    assert number(0.0001234, "value") == "1.2e-4"
    assert number(float("nan"), "value") == "n/a" and number(400, "count") == "400" and number(True) == "yes"


def test_metadata_tables_keep_the_readable_numbers():
    import pandas as pd

    from fear_assets.core.numbers import markdown_table

    text = markdown_table(pd.DataFrame({"rhat": [14462920.0, 1.0042], "note": ["x", float("nan")]}))
    assert "1.4e7" in text and "1.004" in text and "nan" not in text and "14462920" not in text


def test_every_asset_and_check_cites_the_protocol():
    """Issue 15: each asset's and check's description quotes or names the protocol section it
    implements (a section number, an appendix, a decision D<n>), so the UI says why it exists."""
    import re

    from fear_assets.defs.definitions import defs

    graph = defs.resolve_asset_graph()
    cites = re.compile(r"(\b\d\.\d\b|Appendix [ABC]|\bD\d\b|Section \d)")
    missing = [k.to_user_string() for k in graph.get_all_asset_keys() if not cites.search(graph.get(k).description or "")]
    missing += [c.name for c in graph.asset_check_keys
                if not cites.search(graph.get_check_spec(c).description or "")]
    assert not missing, f"descriptions without a protocol section: {missing}"
