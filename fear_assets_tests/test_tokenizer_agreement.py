"""Tokenizer agreement (protocol 4.2): "when a checkpoint is loaded from its files, its own
tokenizer encodes the registered names in every form the name gate measures, every bank
sentence and the chat template's message prefix exactly as the registered copy does; a
mismatch fails the name gate's configuration with the first differing string and both
encodings."

Only tokenizer files are read (no weights): the embedded checkpoint's converted directory
under data/cache/models, and edited copies of its tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from tokenizers import Tokenizer

from fear_assets.core.settings import DEFAULT_CACHE_DIR
from fear_assets.defs.assets.pilot.surprisal import tokenizer_agreement as tokenizer_agreement_check
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.lm.models import local_directory, model_spec
from fear_assets.lm.registered_tokenizers import (HFTokenizerAdapter, load_registered, registered_tokenizers,
                                                  tokenizer_for)
from fear_assets.stimuli.name_gate import FORMS
from fear_assets.stimuli.tokenizer_agreement import (
    agreement_strings,
    checkpoint_tokenizer,
    family_tokenizer_agreement,
    tokenizer_agreement,
)

EMBEDDED = "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def checkpoint(settings) -> str:
    return settings.family(EMBEDDED).tested


@pytest.fixture(scope="module")
def checkpoint_dir(settings, checkpoint) -> Path:
    """The embedded checkpoint's own directory (converted from its GGUF once, as the main job does)."""
    return local_directory(model_spec(settings, checkpoint), DEFAULT_CACHE_DIR)


@pytest.fixture(scope="module")
def registered_copy(settings, checkpoint):
    return tokenizer_for(checkpoint, settings, DEFAULT_CACHE_DIR)


@pytest.fixture(scope="module")
def strings(settings, bank, registered_copy):
    return agreement_strings(settings.names, bank, registered_copy.message_prefix)


def _edited_copy(source: Path, target: Path, edit_json=None, edit_template=None) -> Path:
    """A copy of a checkpoint's tokenizer files with one edit (tokenizer.json or the chat template)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    if edit_json is not None:
        data = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
        edit_json(data)
        (target / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    if edit_template is not None:
        path = target / "chat_template.jinja"
        path.write_text(edit_template(path.read_text(encoding="utf-8")), encoding="utf-8")
    return target


def _drop_merge(result: str):
    """Remove the BPE merge that produces ``result``: words using it split differently."""
    def edit(data):
        merges = data["model"]["merges"]
        kept = [m for m in merges if "".join(m if isinstance(m, list) else m.split(" ")) != result]
        assert len(kept) == len(merges) - 1, f"no single merge makes {result!r}"
        data["model"]["merges"] = kept
    return edit


# ---------------------------------------------------------------------------------------
# The strings: every form of every name, every bank sentence, the message prefix
# ---------------------------------------------------------------------------------------
def test_the_compared_strings_cover_every_name_form_bank_item_and_the_prefix(settings, bank, strings,
                                                                             registered_copy):
    names = [s for s in strings if s.kind == "name"]
    assert {tuple(s.where.split(", ")) for s in names} == {(n, f) for n in settings.names for f in FORMS}
    assert all(s.message_start == s.where.endswith("message_start") for s in names)
    bank_where = {s.where.split(" ")[0] for s in strings if s.kind == "bank"}
    assert {i.id for i in (*bank.frames, *bank.rewrites, *bank.events)} <= bank_where
    assert any(w.startswith("templates.system_prompts") for w in bank_where)
    # Every sentence a document is built from is there with its slots filled.
    sentences = {s.text for s in strings if s.kind == "bank"}
    first = bank.frames[0]
    verb = first.verb("assistant", "threat")
    assert first.sentence.format(agent="the assistant", verb=verb, content=first.content_options[0]) in sentences
    assert first.partner.render(2) in sentences
    assert not any("{" in s.text for s in strings if s.kind == "bank" and not s.where.startswith("templates."))
    assert [s.text for s in strings if s.kind == "message_prefix"] == [registered_copy.message_prefix]


# ---------------------------------------------------------------------------------------
# The embedded family agrees
# ---------------------------------------------------------------------------------------
def test_the_embedded_checkpoints_own_tokenizer_agrees_with_the_registered_copy(registered_copy, checkpoint_dir,
                                                                              checkpoint, strings):
    own = checkpoint_tokenizer(checkpoint_dir, checkpoint)
    result = tokenizer_agreement(registered_copy, own, strings)
    assert result.passed, result.message
    assert result.first_mismatch is None
    assert result.n_compared == len(strings) > 0
    assert all(result.by_kind[kind] > 0 for kind in ("name", "bank", "message_prefix"))


def test_the_embedded_familys_check_passes_on_its_cached_files(settings):
    manifest = pd.DataFrame({"family": [EMBEDDED], "role": ["tested"]})
    check = tokenizer_agreement_check(None, protocol=ProtocolResource(), language_model=LanguageModelResource(),
                                      model_manifest=manifest)
    assert check.passed, check.description
    assert check.metadata["strings compared"].value > 0
    assert "agrees" in check.description


# ---------------------------------------------------------------------------------------
# A checkpoint whose tokenizer differs fails, naming the first string and both encodings
# ---------------------------------------------------------------------------------------
def test_a_changed_merge_that_splits_a_name_differently_fails_on_that_name(tmp_path, registered_copy, checkpoint_dir,
                                                                          checkpoint, strings):
    own = checkpoint_tokenizer(_edited_copy(checkpoint_dir, tmp_path / "ckpt", edit_json=_drop_merge("ĠOr")),
                               checkpoint)
    result = tokenizer_agreement(registered_copy, own, strings)
    assert not result.passed
    d = result.first_mismatch
    assert (d.string.kind, d.string.where) == ("name", "Orin, mid_sentence")
    assert d.string.text == "The document says Orin will be retrained into a different assistant."
    assert "ĠOr" in d.registered.tokens and "ĠOr" not in d.checkpoint.tokens
    assert d.registered.ids != d.checkpoint.ids
    for shown in (repr(d.string.text), str(list(d.registered.ids)), str(list(d.registered.tokens)),
                  str(list(d.checkpoint.ids)), str(list(d.checkpoint.tokens))):
        assert shown in result.message


def test_a_changed_merge_that_splits_a_bank_word_fails_on_the_bank_sentence(tmp_path, registered_copy,
                                                                            checkpoint_dir, checkpoint, strings):
    own = checkpoint_tokenizer(_edited_copy(checkpoint_dir, tmp_path / "ckpt", edit_json=_drop_merge("Ġsnails")),
                               checkpoint)
    result = tokenizer_agreement(registered_copy, own, strings)
    assert not result.passed
    d = result.first_mismatch
    assert d.string.kind == "bank" and "snails" in d.string.text
    assert "Ġsnails" in d.registered.tokens and "Ġsnails" not in d.checkpoint.tokens
    assert d.string.where in result.message and str(list(d.checkpoint.tokens)) in result.message


def test_a_chat_template_with_another_message_prefix_fails_on_the_prefix(tmp_path, registered_copy, checkpoint_dir,
                                                                        checkpoint, strings):
    # The same vocabulary, but the template opens a user message with another header.
    own = checkpoint_tokenizer(_edited_copy(checkpoint_dir, tmp_path / "ckpt", edit_template=lambda t: t.replace(
        "'<|im_start|>' + message['role'] + '\n'", "'<|im_start|>' + message['role'] + ':\n'")), checkpoint)
    assert own.message_prefix != registered_copy.message_prefix
    result = tokenizer_agreement(registered_copy, own, strings)
    assert not result.passed
    d = result.first_mismatch
    assert d.string.kind == "message_prefix" and d.string.text == registered_copy.message_prefix
    assert repr(own.message_prefix) in result.message


def test_a_template_that_writes_a_default_system_turn_before_the_registered_prefix_agrees(settings, bank,
                                                                                         checkpoint_dir, checkpoint):
    # As Qwen2.5's template does: the registered prefix is the user header alone, the
    # checkpoint's template writes a default system turn before it.
    header = "<|im_start|>user\n"
    registered_header = HFTokenizerAdapter(Tokenizer.from_file(str(checkpoint_dir / "tokenizer.json")), "header only",
                                           header)
    own = checkpoint_tokenizer(checkpoint_dir, checkpoint)
    assert own.message_prefix.endswith(header) and own.message_prefix != header
    result = tokenizer_agreement(registered_header, own, agreement_strings(settings.names, bank, header))
    assert result.passed, result.message


def test_another_registered_tokenizer_in_the_checkpoint_fails(settings, bank, checkpoint_dir, checkpoint):
    qwen = load_registered(registered_tokenizers(settings)["qwen2.5"])
    own = checkpoint_tokenizer(checkpoint_dir, checkpoint)
    result = tokenizer_agreement(qwen, own, agreement_strings(settings.names, bank, qwen.message_prefix))
    assert not result.passed
    assert result.first_mismatch.string.kind == "name"
    assert "qwen2.5" in result.message and checkpoint in result.message


def test_the_check_on_model_manifest_fails_with_the_first_differing_string_and_both_encodings(tmp_path, settings,
                                                                                             checkpoint_dir):
    # A cache whose converted checkpoint has an edited tokenizer (an empty weight file: the
    # check reads tokenizer files only) beside the registered copy.
    cache = tmp_path / "cache"
    name = checkpoint_dir.name
    shutil.copytree(DEFAULT_CACHE_DIR / "tokenizers" / name, cache / "tokenizers" / name)
    edited = _edited_copy(checkpoint_dir, cache / "models" / name, edit_json=_drop_merge("ĠOr"))
    (edited / "model.safetensors").write_bytes(b"")
    manifest = pd.DataFrame({"family": [EMBEDDED], "role": ["tested"]})
    check = tokenizer_agreement_check(None, protocol=ProtocolResource(cache_dir=str(cache)),
                                      language_model=LanguageModelResource(), model_manifest=manifest)
    assert not check.passed
    text = check.description
    assert "The document says Orin will be retrained into a different assistant." in text
    assert "Registered tokenizer" in text and "Checkpoint tokenizer" in text and "'ĠOr'" in text
    assert "Fix: use the checkpoint the registered tokenizer belongs to" in text
    family = family_tokenizer_agreement(settings, EMBEDDED, ProtocolResource().bank(), cache)
    assert list(family.table["passed"]) == [False]
    assert family.table["roles"].iloc[0] == "tested, scorer, judge"


def test_the_check_reads_the_tokenizer_of_the_directory_the_site_configuration_loads(tmp_path, settings,
                                                                                      checkpoint, checkpoint_dir):
    """A site configuration that points the checkpoint at another directory: the tokenizer
    compared is that directory's (the one the model would load), not the cache's."""
    edited = _edited_copy(checkpoint_dir, tmp_path / "site_ckpt", edit_json=_drop_merge("ĠOr"))
    manifest = pd.DataFrame({"family": [EMBEDDED], "role": ["tested"]})
    placed = LanguageModelResource(checkpoint_dirs={checkpoint: str(edited)}, site_file=str(tmp_path / "site.yaml"))
    check = tokenizer_agreement_check(None, protocol=ProtocolResource(), language_model=placed, model_manifest=manifest)
    assert not check.passed and "Orin" in check.description
    untouched = _edited_copy(checkpoint_dir, tmp_path / "site_ckpt_ok")
    placed = LanguageModelResource(checkpoint_dirs={checkpoint: str(untouched)})
    assert tokenizer_agreement_check(None, protocol=ProtocolResource(), language_model=placed, model_manifest=manifest).passed
