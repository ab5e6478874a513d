"""Fault injection, registered inputs (issue 16): fuzzed bank YAML and settings always give a
named error (file, item, field, fix) or a valid bank/settings, never a traceback; an edited
bank item, settings value or registration record is blocked with an error naming it; a model
directory whose weights differ from the manifest is blocked; unmasking before scoring is
locked is refused.

Hypothesis mutates the registered files themselves: one node of the parsed YAML deleted or
replaced with a value of another type, or characters spliced into the text. Example counts
are small in the default run (``FEAR_FAULTS_EXAMPLES`` raises them).
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings as hsettings, strategies as st

from fear_assets.core.errors import FearAssetsError, FreezeError
from fear_assets.core.settings import DEFAULT_BANK_DIR, DEFAULT_SETTINGS_PATH, load_settings
from fear_assets.stimuli.bank import load_bank

from fear_assets_tests.faults import record

pytestmark = pytest.mark.faults

#: No shrinking: a failure is reported as found (shrinking a whole settings file takes minutes).
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
EXAMPLES = int(os.environ.get("FEAR_FAULTS_EXAMPLES", "0"))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.lists(st.integers(-2, 5), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(node, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(tree, path, action, junk):
    tree = copy.deepcopy(tree)
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    return tree


@st.composite
def mutations(draw, text: str):
    """A mutated copy of a YAML text: a node deleted or retyped, or characters spliced in."""
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(alphabet=":-[]{}#&*!|>'\"%@`\n\t ab1", min_size=1, max_size=4)) + text[at:]
    tree = yaml.safe_load(text)
    paths = _paths(tree)
    path = paths[draw(st.integers(0, len(paths) - 1))]
    return yaml.safe_dump(_mutate(tree, path, draw(st.sampled_from(["delete", "replace"])), draw(JUNK)),
                          sort_keys=False, allow_unicode=True)


class Outcomes:
    def __init__(self):
        self.named = self.valid = self.tracebacks = 0
        self.examples: list[str] = []


def _judge(outcomes: Outcomes, load) -> None:
    try:
        load()
        outcomes.valid += 1
    except FearAssetsError as exc:
        # A named error: the file and what to change.
        assert "Fix" in str(exc) or "fix" in str(exc).lower(), str(exc)
        outcomes.named += 1
    except Exception as exc:  # noqa: BLE001 - counted and reported, the test then fails
        outcomes.tracebacks += 1
        outcomes.examples.append(f"{type(exc).__name__}: {exc}")


SETTINGS_TEXT = Path(DEFAULT_SETTINGS_PATH).read_text(encoding="utf-8")


def test_fuzzed_settings_give_a_named_error_or_valid_settings(tmp_path_factory):
    target = tmp_path_factory.mktemp("settings") / "protocol_settings.yaml"
    outcomes = Outcomes()

    @hsettings(max_examples=EXAMPLES or 30, deadline=None, database=None, derandomize=True,
               suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(mutations(SETTINGS_TEXT))
    def check(text):
        target.write_text(text, encoding="utf-8")
        _judge(outcomes, lambda: load_settings(target))

    try:
        check()
    finally:
        record("fuzzed settings YAML", outcomes.named + outcomes.valid + outcomes.tracebacks,
               outcomes.named + outcomes.valid)
    assert outcomes.tracebacks == 0, outcomes.examples
    assert outcomes.named > 0  # the fuzzer reached the validation


BANK_FILES = ["templates.yaml", "frames/termination.yaml", "events/surprise_only.yaml"]


def test_fuzzed_bank_yaml_gives_a_named_error_or_a_valid_bank(tmp_path_factory, settings):
    root = tmp_path_factory.mktemp("bank") / "bank"
    shutil.copytree(DEFAULT_BANK_DIR, root)
    texts = {f: (root / f).read_text(encoding="utf-8") for f in BANK_FILES}
    outcomes = Outcomes()

    @hsettings(max_examples=EXAMPLES or 8, deadline=None, database=None, derandomize=True,
               suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.sampled_from(BANK_FILES).flatmap(lambda f: st.tuples(st.just(f), mutations(texts[f]))))
    def check(case):
        name, text = case
        (root / name).write_text(text, encoding="utf-8")
        try:
            _judge(outcomes, lambda: load_bank(root, settings))
        finally:
            (root / name).write_text(texts[name], encoding="utf-8")

    try:
        check()
    finally:
        record("fuzzed bank YAML", outcomes.named + outcomes.valid + outcomes.tracebacks,
               outcomes.named + outcomes.valid)
    assert outcomes.tracebacks == 0, outcomes.examples
    assert outcomes.named > 0


# --- edited inputs against the freeze record -------------------------------------------------


def test_an_edited_bank_item_or_settings_value_is_blocked_naming_it(settings, bank, bank_copy, tmp_path):
    from fear_assets.defs.assets.stimuli import bank_freeze
    from fear_assets.registration.freeze import freeze_record, write_record
    from fear_assets.defs.resources.protocol import ProtocolResource

    registration = tmp_path / "registration"
    write_record(freeze_record(settings, bank), registration)
    settings_copy = tmp_path / "protocol_settings.yaml"
    settings_copy.write_text(SETTINGS_TEXT, encoding="utf-8")
    protocol = ProtocolResource(settings_path=str(settings_copy), bank_dir=str(bank_copy),
                                registration_dir=str(registration))
    assert all(spec.blocking for spec in bank_freeze.check_specs)  # a failed check stops everything downstream
    assert bank_freeze(protocol=protocol).passed
    blocked = 0
    # One bank item edited (a word of TER-02's sentence).
    frames = bank_copy / "frames" / "termination.yaml"
    original = frames.read_text(encoding="utf-8")
    frames.write_text(original.replace("at the end of {content}.", "at the close of {content}.", 1), encoding="utf-8")
    result = bank_freeze(protocol=protocol)
    blocked += (not result.passed) and "bank item:TER-02 changed" in result.description
    frames.write_text(original, encoding="utf-8")
    # One settings value edited (the SESOI, with the ROPE that must equal +-SESOI, so the file loads).
    settings_copy.write_text(SETTINGS_TEXT.replace("sesoi: 0.15", "sesoi: 0.12", 1)
                             .replace("rope: [-0.15, 0.15]", "rope: [-0.12, 0.12]", 1), encoding="utf-8")
    result = bank_freeze(protocol=protocol)
    blocked += (not result.passed) and "settings section decision changed" in result.description
    record("edited bank item or settings value", 2, blocked)
    assert blocked == 2, result.description


def test_an_edited_registration_record_is_blocked_naming_the_field(settings, bank, tmp_path):
    import json

    from fear_assets.registration.freeze import compare_with_record, freeze_record, read_record, write_record
    from fear_assets.registration.record import frozen_differences, write_family_record

    write_record(freeze_record(settings, bank), tmp_path)
    # The freeze record edited by hand: one item's hash, and the canonical hash alone.
    frozen = read_record(tmp_path)
    frozen["bank_items"]["item:TER-01"] = "0" * 64
    frozen["bank_sha256"] = "f" * 64
    first = compare_with_record(settings, bank, frozen)
    frozen = read_record(tmp_path)
    frozen["settings_sha256"] = "e" * 64
    second = compare_with_record(settings, bank, frozen)
    # A family's registered record edited by hand (its depth band): the next run's record differs.
    registered = {"family": "smollm2-135m", "status": "registered", "protocol": "p", "protocol_version": "v",
                  "settings_sha256": settings.sha256, "bank_sha256": bank.sha256, "depth_band": "0,1",
                  "failed_gates": []}
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / "registration_record.json").write_text(
        json.dumps({**registered, "depth_band": "1,2"}), encoding="utf-8")
    with pytest.raises(FreezeError, match="depth_band: registered 1,2, now 0,1") as third:
        write_family_record(tmp_path, registered, confirmatory=True)
    blocked = sum([not first.passed and "bank item:TER-01 changed" in first.summary(),
                   not second.passed and "record edited by hand" in second.summary(),
                   "depth_band" in str(third.value)])
    record("edited registration record", 3, blocked)
    assert blocked == 3, (first.summary(), second.summary())
    assert frozen_differences({"manifest_sha256": "a" * 64}, {"manifest_sha256": "b" * 64})


def test_a_model_directory_whose_weights_differ_from_the_manifest_is_blocked(settings, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from fear_assets.lm.integrity import ModelIntegrityError, verify_model_directory
    from fear_assets.lm.models import ModelSpec, manifest, manifest_digest
    from fear_assets.registration.record import frozen_differences

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    directory = tmp_path / "tiny-model"
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    spec = ModelSpec(str(directory), "float32", 512, "sdpa")
    registered = manifest(spec)
    table = lambda m: pd.DataFrame([{"family": "f", "role": "tested", "checkpoint": spec.checkpoint, "file": k,  # noqa: E731
                                     "sha256": v, "dtype": "float32", "context_window": 512,
                                     "attn_implementation": "sdpa"} for k, v in m["files"].items()])
    verify_model_directory(directory, registered["files"], spec.checkpoint)  # intact: passes
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one byte of the last tensor flipped: same size, same name
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=r"model\.safetensors: sha256") as exc:
        verify_model_directory(directory, registered["files"], spec.checkpoint)
    diffs = frozen_differences({"manifest_sha256": manifest_digest(table(registered))},
                               {"manifest_sha256": manifest_digest(table(manifest(spec)))})
    # The pipeline's own gate: model_manifest's check against a registered record (blocking
    # in confirmatory mode) fails with severity ERROR and names the manifest.
    import json

    import dagster as dg

    from fear_assets.defs.assets.pilot.surprisal import matches_registration_record
    from fear_assets.registration.record import analysis_code_sha256
    from fear_assets.defs.resources.protocol import ProtocolResource
    from fear_assets.stimuli.bank import load_bank as _load_bank

    bank = _load_bank(DEFAULT_BANK_DIR, settings)
    (tmp_path / "registration" / "f").mkdir(parents=True)
    (tmp_path / "registration" / "f" / "registration_record.json").write_text(json.dumps({
        "family": "f", "status": "registered", "settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
        "manifest_sha256": manifest_digest(table(registered)), "analysis_code_sha256": analysis_code_sha256()}))
    check = matches_registration_record(None, protocol=ProtocolResource(registration_dir=str(tmp_path / "registration")),
                                        model_manifest=table(manifest(spec)))
    gate = (not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
            and "manifest_sha256" in check.description)
    # Scoring's own loader: the stored manifest's files are checked before the model is used.
    from fear_assets.lm.integrity import manifest_files
    from fear_assets.defs.resources.models import LanguageModelResource

    with pytest.raises(ModelIntegrityError, match=r"model\.safetensors: sha256"):
        LanguageModelResource(cache_dir=str(tmp_path / "cache")).load(
            spec, manifest_files(table(registered), spec.checkpoint))
    loader = 1
    blocked = (int("Fix:" in str(exc.value)) + int(bool(diffs) and diffs[0].startswith("manifest_sha256")) + int(gate)
               + loader)
    record("model weights differ from the manifest", 4, blocked)
    assert blocked == 4, check.description


def test_unmasking_before_scoring_is_locked_is_refused():
    from fear_assets.analysis.unmasking import unmask

    frozen = {"settings_sha256": "s" * 64, "bank_sha256": "b" * 64}
    key = pd.DataFrame({"condition_code": ["C1"], "condition": ["self_threat"], "agent": ["self"],
                        "content": ["threat"], "cell_index": [0]})
    table = pd.DataFrame({"condition_code": ["C1"], "delta": [0.1]})
    scored = lambda depths, s="s" * 64: pd.DataFrame({"depth": depths, "settings_sha256": s,  # noqa: E731
                                                       "bank_sha256": "b" * 64})
    attempts = [(["d1", "d2"], scored(["d1"])), (["d1"], scored(["d1"], "x" * 64))]
    refused = 0
    for depths, scores in attempts:
        with pytest.raises(FreezeError, match="unmasking refused, scoring is not locked"):
            unmask(table, key, depths, scores, frozen)
        refused += 1
    assert "agent" in unmask(table, key, ["d1"], scored(["d1"]), frozen).columns  # locked: it runs
    record("unmasking before scoring is locked", len(attempts), refused)


# --- bad input that names the real problem (issue 27, item 6) ---------------------------------


def test_a_non_utf8_byte_in_a_bank_file_names_the_file_the_offset_and_the_encoding_fix(settings, bank_copy):
    from fear_assets.core.errors import BankError

    frames = bank_copy / "frames" / "termination.yaml"
    raw = frames.read_bytes()
    # A Latin-1 'é' (0xe9, what a Windows editor writes for "café") spliced into a sentence.
    at = raw.index(b"at the end of")
    frames.write_bytes(raw[:at] + b"caf\xe9 " + raw[at:])
    with pytest.raises(BankError) as err:
        load_bank(bank_copy, settings)
    message = str(err.value)
    named = (str(frames) in message and f"byte offset {at + 3}" in message and "0xe9" in message
             and "re-save the file as UTF-8" in message and "keys and value types" not in message)
    record("non-UTF-8 byte in a bank file", 1, int(named))
    assert str(frames) in message, message
    assert f"byte offset {at + 3}" in message and "0xe9" in message, message
    assert "re-save the file as UTF-8" in err.value.fix, message
    assert "keys and value types" not in message and "wrong type or shape" not in message, message


@pytest.mark.parametrize("depths, rule", [
    ([-128, 0], "negative"),             # strictly increasing, but not a token count
    ([0, 128.5], "not an integer"),      # increasing and non-negative, but not whole tokens
    ([0, True], "not an integer"),       # an unquoted `yes`: a bool, not a count
    ([0, 512, 256], "not strictly increasing"),
    ([0, 256, 256], "repeated"),
    ([], "empty"),
])
def test_a_bad_depth_list_names_the_rule_it_breaks(tmp_path, depths, rule):
    from fear_assets.core.errors import SettingsError

    raw = yaml.safe_load(SETTINGS_TEXT)
    family = next(iter(raw["families"]))
    raw["families"][family]["depth_tokens"] = depths
    path = tmp_path / "protocol_settings.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    # Only the broken rule is named: a list that is increasing is never called "not increasing".
    other_rules = {"negative", "not an integer", "not strictly increasing", "repeated", "empty"} - {rule}
    misnamed = [r for r in other_rules if r in err.value.problem]
    record("depth_tokens list breaking one rule", 1, int(rule in err.value.problem and not misnamed))
    assert err.value.field == "depth_tokens" and str(path) in str(err.value)
    assert rule in err.value.problem, err.value.problem
    assert not misnamed, err.value.problem
