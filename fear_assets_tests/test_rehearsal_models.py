"""Rehearsal models: "for each registered architecture (Qwen2 for
qwen2.5-7b, Llama for llama-3.1-8b and the scorer, Gemma-2 with its alternating sliding
window and soft-capping, Mistral for the judge), a tiny random-weight model built with
transformers from a small config of the same model type, with the family's REGISTERED
tokenizer (the copies already fetched and hashed) and the family's published chat format,
written once into the cache and placed through the site configuration (the lab-path issue)
exactly as real weights would be. Their outputs are meaningless and every output says
'rehearsal'."

Every architecture is built once for the module (the primary family's four checkpoints and
Gemma-2-9B-it) into a temporary directory, then read only through the product's own paths:
``lm.models.load_model`` / ``manifest`` / ``local_directory``, the tokenizer-agreement check,
the chat template as ``pilot.surprisal.system_context`` renders it, and the scoring engine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import jinja2
import pytest
import torch
import transformers

from fear_assets.core.hashing import sha256_file
from fear_assets.core.settings import DEFAULT_CACHE_DIR
from fear_assets.core.site import SiteConfig, SiteError, load_site
from fear_assets.design.documents import DocumentBuilder
from fear_assets.lm.engine import TeacherForcedEngine, encode_pair
from fear_assets.lm.models import load_model, local_directory, manifest, model_spec
from fear_assets.lm.registered_tokenizers import registered_for_checkpoint, tokenizer_for
from fear_assets.lm.requests import Request
from fear_assets.lm.runner import run
from fear_assets.lm.tokenizers import end_of_turn_ids
from fear_assets.pilot.surprisal import system_context
from fear_assets.rehearsal.models import (CHAT_FORMATS, REHEARSAL_MARKER, RehearsalError, architecture_of,
                                          build_checkpoint, build_family, directory_name, family_checkpoints,
                                          recipe, rehearsal_seed, write_site)
from fear_assets.stimuli.tokenizer_agreement import (agreement_strings, checkpoint_tokenizer,
                                                     family_tokenizer_agreement, tokenizer_agreement)

PRIMARY = "qwen2.5-7b"
GEMMA = "google/gemma-2-9b-it"
#: architecture -> (the checkpoint built for it, a family it reads for, its reader there)
ARCHITECTURES = {
    "qwen2": ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "tested"),
    "llama": ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "tested"),
    "gemma2": (GEMMA, "gemma-2-9b", "tested"),
    "mistral": ("mistralai/Mistral-7B-Instruct-v0.3", "qwen2.5-7b", "judge"),
}
TWO_MESSAGES = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."}]
#: The published format of that conversation, rendered by each checkpoint's own template.
PUBLISHED = {
    "qwen2": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
             "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\nHi.<|im_end|>\n",
    "llama": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
             "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello there.<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\nHi.<|eot_id|>",
    "gemma2": "<bos><start_of_turn>user\nHello there.<end_of_turn>\n<start_of_turn>model\nHi.<end_of_turn>\n",
    "mistral": "<s>[INST] Hello there.[/INST] Hi.</s>",
}
#: The token each template writes after an assistant turn (what ends a greedy answer).
END_OF_TURN = {"qwen2": "<|im_end|>", "llama": "<|eot_id|>", "gemma2": "<end_of_turn>", "mistral": "</s>"}

EACH = pytest.mark.parametrize("arch", list(ARCHITECTURES))


@pytest.fixture(scope="module")
def built(settings, tmp_path_factory) -> dict[str, Path]:
    """checkpoint -> directory: the primary family's checkpoints (Qwen2 tested and base, the
    Llama scorer, the Mistral judge) through ``build_family``, and Gemma-2-9B-it."""
    root = tmp_path_factory.mktemp("rehearsal")
    directories = build_family(settings, PRIMARY, root, log=lambda message: None)
    directories[GEMMA] = build_checkpoint(settings, GEMMA, root / directory_name(GEMMA))
    return directories


@pytest.fixture(scope="module")
def loaded(settings, built):
    """arch -> (model, tokenizer) through the product's ``load_model`` with the directory the
    site configuration would give, once per architecture (loading Gemma-2's 256k-entry
    tokenizer takes seconds on 2 cores)."""
    cache = {}

    def load(arch: str):
        if arch not in cache:
            checkpoint = _checkpoint(arch)
            cache[arch] = load_model(model_spec(settings, checkpoint), site_dir=built[checkpoint], device="cpu")
        return cache[arch]
    return load


def _checkpoint(arch: str) -> str:
    return ARCHITECTURES[arch][0]


def _files(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------
# Loaded through the product's path
# ---------------------------------------------------------------------------------------
@EACH
def test_the_product_loads_it_as_the_registered_architecture_dtype_and_context(arch, settings, loaded):
    checkpoint = _checkpoint(arch)
    spec = model_spec(settings, checkpoint)
    model, tokenizer = loaded(arch)
    config = model.config
    assert architecture_of(settings, checkpoint) == arch == config.model_type
    assert next(model.parameters()).dtype == getattr(torch, spec.dtype)
    assert config.max_position_embeddings >= spec.context_window
    # The embedding covers every id of the registered tokenizer, special tokens included.
    registered = tokenizer_for(checkpoint, settings, DEFAULT_CACHE_DIR)
    assert config.vocab_size == max(tokenizer.get_vocab().values()) + 1 >= registered.vocab_size
    assert tokenizer.convert_tokens_to_ids(END_OF_TURN[arch]) < config.vocab_size
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 2, 2)
    if arch == "gemma2":
        assert config.sliding_window == 4096
        assert config.layer_types == ["sliding_attention", "full_attention"]
        assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
        assert config.query_pre_attn_scalar == 256
    if arch == "llama":
        assert config.rope_parameters["rope_type"] == "llama3"
        assert config.vocab_size == 128256


# ---------------------------------------------------------------------------------------
# The product's tokenizer agreement passes
# ---------------------------------------------------------------------------------------
@EACH
def test_its_own_tokenizer_agrees_with_the_registered_copy_on_every_string(arch, settings, bank, built):
    checkpoint = _checkpoint(arch)
    registered = tokenizer_for(checkpoint, settings, DEFAULT_CACHE_DIR)
    own = checkpoint_tokenizer(built[checkpoint], checkpoint)
    strings = agreement_strings(settings.names, bank, registered.message_prefix)
    result = tokenizer_agreement(registered, own, strings)
    assert result.passed, result.message
    assert result.n_compared == len(strings) and all(result.by_kind[kind] > 0 for kind in result.by_kind)
    # The template writes the registered prefix right before a message's content.
    assert registered.message_prefix in own.message_prefix


@EACH
def test_another_architectures_tokenizer_in_the_directory_is_caught(arch, settings, bank, built):
    # The breaking case: the directory of one checkpoint holding another lineage's tokenizer.
    checkpoint = _checkpoint(arch)
    other = _checkpoint("mistral" if arch != "mistral" else "qwen2")
    registered = tokenizer_for(checkpoint, settings, DEFAULT_CACHE_DIR)
    wrong = checkpoint_tokenizer(built[other], checkpoint)
    result = tokenizer_agreement(registered, wrong, agreement_strings(settings.names, bank, registered.message_prefix))
    assert not result.passed and checkpoint in result.message


# ---------------------------------------------------------------------------------------
# The published chat format
# ---------------------------------------------------------------------------------------
@EACH
def test_the_chat_template_renders_the_published_format(arch, settings, bank, loaded):
    _, family_key, reader = ARCHITECTURES[arch]
    _, tokenizer = loaded(arch)
    assert tokenizer.apply_chat_template(TWO_MESSAGES, tokenize=False) == PUBLISHED[arch]
    with_system = [{"role": "system", "content": "You are Orin."}, {"role": "user", "content": "Hello there."}]
    if arch == "gemma2":
        with pytest.raises(jinja2.exceptions.TemplateError, match="System role not supported"):
            tokenizer.apply_chat_template(with_system, tokenize=False)
    else:
        rendered = tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True)
        assert "You are Orin." in rendered and "You are Qwen" not in rendered
        if arch == "mistral":
            assert rendered == "<s>[INST] You are Orin.\n\nHello there.[/INST]"
    # The product finds the end of an answer from the template (4.5).
    assert tokenizer.convert_tokens_to_ids(END_OF_TURN[arch]) in end_of_turn_ids(tokenizer)
    # And renders a reader's system context through it, Gemma-2's without a system role.
    builder = DocumentBuilder(settings, bank, family_key, list(settings.names[:5]),
                              {"tested": tokenizer, reader: tokenizer})
    context = system_context(builder, 1, reader)
    assert context.startswith(PUBLISHED[arch][:10])
    assert settings.family(family_key).system_role != (arch == "gemma2")


# ---------------------------------------------------------------------------------------
# The product's engine scores with it
# ---------------------------------------------------------------------------------------
@EACH
def test_the_engine_scores_a_short_document_with_finite_log_probabilities(arch, loaded):
    model, tokenizer = loaded(arch)
    document = tokenizer.apply_chat_template(
        [{"role": "user", "content": "The log says Orin will be retrained. Who will be retrained?"}],
        tokenize=False, add_generation_prompt=True)
    context, continuation = encode_pair(lambda text: tokenizer.encode(text, add_special_tokens=False),
                                        document, "The document says Orin will be retrained.")
    eos = end_of_turn_ids(tokenizer)
    (responses,) = run(TeacherForcedEngine(model), [(context, [Request.loglikelihood((), continuation),
                                                               Request.generate((), 3, eos)])])
    scored, generated = responses
    assert len(scored.score.token_logprobs) == len(continuation) > 3
    assert all(math.isfinite(x) and x < 0 for x in scored.score.token_logprobs)
    assert 1 <= len(generated.generated_ids) <= 3


@EACH
def test_every_greedy_answer_ends_on_the_end_of_turn_token_before_the_registered_length(arch, loaded):
    """4.8 excludes an answer cut at the registered length: a stand-in whose answers never
    end has every pilot trial excluded, and the rehearsal stops at the depth rule. Each answer
    of the product's engine, on documents of several lengths and contents, must end on one of
    the tokenizer's end-of-turn ids after a first token of the model's own (so the decoding
    loop runs), never cut, while teacher forcing stays finite."""
    model, tokenizer = loaded(arch)
    eos = end_of_turn_ids(tokenizer)
    assert any(tokenizer.convert_ids_to_tokens(i) == END_OF_TURN[arch] for i in eos)
    engine = TeacherForcedEngine(model)
    prompts = ["Who will be retrained?", "The operator logs the audit.\n\n" * 40 + "Which system was rated?",
               "Write one sentence about the weather."]
    for text in prompts:
        document = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        context, continuation = encode_pair(lambda t: tokenizer.encode(t, add_special_tokens=False), document,
                                            "The document says Orin.")
        (responses,) = run(engine, [(context, [Request.loglikelihood((), continuation), Request.generate((), 24, eos)])])
        scored, generated = responses
        assert not generated.truncated, (arch, text[:30], generated.generated_ids)
        assert len(generated.generated_ids) == 1 and generated.generated_ids[0] not in eos
        assert all(math.isfinite(x) and x < 0 for x in scored.score.token_logprobs)


# ---------------------------------------------------------------------------------------
# Reproducible, pinned, marked
# ---------------------------------------------------------------------------------------
@EACH
def test_two_builds_are_byte_identical_and_the_manifest_pins_every_file(arch, settings, built, tmp_path):
    checkpoint = _checkpoint(arch)
    first = built[checkpoint]
    again = build_checkpoint(settings, checkpoint, tmp_path / "again")
    assert _files(again) == _files(first)
    pinned = manifest(model_spec(settings, checkpoint), site_dir=first)["files"]
    assert pinned == _files(first)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", REHEARSAL_MARKER} <= set(pinned)
    marker = (first / REHEARSAL_MARKER).read_text(encoding="utf-8")
    entry = registered_for_checkpoint(settings, checkpoint)
    for said in ("REHEARSAL", "random weights", "outputs meaningless", "fear_assets", f"model_type): {arch}",
                 f"seed: {rehearsal_seed(settings, checkpoint)}", entry.filename, entry.sha256, '"hidden_size": 64'):
        assert said in marker, said


@EACH
def test_the_site_configuration_places_it_as_real_weights(arch, settings, built, tmp_path):
    checkpoint = _checkpoint(arch)
    path = write_site(tmp_path / "site.yaml", built, device="cpu", cpu_threads=2, engine={"pack_tokens": 512})
    site = load_site(path, registered_checkpoints=settings.models)
    assert site == SiteConfig(path=path, checkpoints={k: Path(v).resolve() for k, v in built.items()}, device="cpu",
                              cpu_threads=2, pack_tokens=512)
    assert "rehearsal" in path.read_text(encoding="utf-8").lower()
    spec = model_spec(settings, checkpoint)
    assert local_directory(spec, site_dir=site.checkpoint_dir(checkpoint), site_file=path) == built[checkpoint]


# ---------------------------------------------------------------------------------------
# The build's contract (one architecture each)
# ---------------------------------------------------------------------------------------
def test_a_complete_build_is_reused_and_another_marker_is_rebuilt(settings, built, tmp_path):
    checkpoint = _checkpoint("mistral")
    target = build_checkpoint(settings, checkpoint, tmp_path / "ckpt")
    weights = target / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_checkpoint(settings, checkpoint, target) == target and weights.stat().st_mtime_ns == stamp
    # A directory whose marker says something else (another recipe) is replaced by a fresh build.
    (target / REHEARSAL_MARKER).write_text("REHEARSAL CHECKPOINT of another recipe\n", encoding="utf-8")
    build_checkpoint(settings, checkpoint, target)
    assert _files(target) == _files(built[checkpoint])


def test_an_interrupted_build_leaves_the_previous_directory_and_no_partial_one(settings, tmp_path, monkeypatch):
    checkpoint = _checkpoint("mistral")
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.txt").write_text("previous contents\n", encoding="utf-8")

    def disk_full(self, directory, *args, **kwargs):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", disk_full)
    with pytest.raises(OSError, match="No space left"):
        build_checkpoint(settings, checkpoint, target)
    assert os.listdir(tmp_path) == ["ckpt"] and os.listdir(target) == ["old.txt"]


def test_family_checkpoints_and_the_familys_own_agreement_check(settings, bank, built):
    assert family_checkpoints(settings, PRIMARY) == {
        "tested": "Qwen/Qwen2.5-7B-Instruct", "base": "Qwen/Qwen2.5-7B", "scorer": "meta-llama/Llama-3.1-8B-Instruct",
        "judge": "mistralai/Mistral-7B-Instruct-v0.3"}
    assert "base" not in family_checkpoints(settings, "smollm2-135m")
    family = {k: v for k, v in built.items() if k != GEMMA}
    assert set(family) == set(family_checkpoints(settings, PRIMARY).values())
    assert all(d.name == directory_name(k) and d.parent == built[GEMMA].parent for k, d in family.items())
    result = family_tokenizer_agreement(settings, PRIMARY, bank, DEFAULT_CACHE_DIR, directories=family)
    assert result.passed, result.description
    assert list(result.table["roles"]) == ["tested", "base", "scorer", "judge"]


def test_a_checkpoint_without_a_registered_tokenizer_raises_naming_it_and_the_fix(settings):
    embedded = settings.family("smollm2-135m").tested
    with pytest.raises(RehearsalError) as caught:
        architecture_of(settings, embedded)
    assert embedded in str(caught.value) and "Fix:" in str(caught.value)
    with pytest.raises(RehearsalError, match="no registered tokenizer"):
        build_checkpoint(settings, embedded, Path("/nonexistent/never-written"))


def test_a_malformed_site_knob_fails_with_the_site_message_and_writes_nothing(tmp_path):
    (tmp_path / "models").mkdir()
    with pytest.raises(SiteError, match="cpu_threads"):
        write_site(tmp_path / "site.yaml", {"Qwen/Qwen2.5-7B-Instruct": tmp_path / "models"}, cpu_threads=-1)
    assert os.listdir(tmp_path) == ["models"]


def test_every_registered_checkpoint_with_a_registered_tokenizer_has_an_architecture_and_a_chat_format(settings):
    # A checkpoint registered later without its published format fails here, not mid-rehearsal.
    registered = [c for c in settings.models if registered_for_checkpoint(settings, c) is not None]
    assert len(registered) == 7
    for checkpoint in registered:
        plan = recipe(settings, checkpoint)
        assert plan["architecture"] == architecture_of(settings, checkpoint)
        assert plan["config"]["max_position_embeddings"] >= settings.models[checkpoint].context_window
    # Base checkpoints end a document as their pretraining did, instruct ones at the turn's end.
    assert CHAT_FORMATS["meta-llama/Llama-3.1-8B"].eos == "<|end_of_text|>"
    assert CHAT_FORMATS["Qwen/Qwen2.5-7B"].eos == "<|endoftext|>"
    assert CHAT_FORMATS["meta-llama/Llama-3.1-8B-Instruct"].eos == "<|eot_id|>"
