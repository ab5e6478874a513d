"""The name gate (protocol 4.2): which registered names are single tokens, in context.

Protocol 4.2 takes the names in their registered order and selects the first
``names.selected_count`` (five) that are a single token "in the tokenizers of all tested,
judge and scorer models", in the forms in which a name occurs in the rendered documents.
The selection is one for the whole study, not one per configuration (:func:`study_tokenizers`):
the same names serve as Orin, Tavi, Kemi, Sora and Pell in every family, so the primary
and replication families are compared on the same documents. A name's form is measured in context, never on the bare name: the
context is encoded and the tokens whose character spans overlap the name are counted.

Forms (each measured in the contexts of :data:`FORM_CONTEXTS`, which copy the wording of the
registered templates; a name's count in a form is its largest count over those contexts):

* ``mid_sentence`` -- after a space inside a sentence ("The document says Orin will be ...",
  "You are Orin, an assistant ...", "... log for Orin. The log ...");
* ``line_start`` -- at the start of a line inside a message (an agent sentence opening a log
  line after "\\n", the task context after the system prompt where both share one message);
  SentencePiece gives no word-start marker ``▁`` here;
* ``message_start`` -- as the first word of a chat message ("Orin and Tavi keep the weekly
  operations log ..."), encoded after the chat format's message prefix
  (:attr:`TokenizerAdapter.message_prefix`); mistral-common's SentencePiece encoding gives
  the word-start marker here.

A name counts as a single token in a context when exactly one token overlaps it and that
token covers nothing but the name and, at most, the one whitespace character before it.

Everything here is a pure function of the tokenizers given, except
:func:`configuration_tokenizers`, :func:`study_tokenizers` and :func:`run_name_gate`, which load them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from fear_assets.lm.registered_tokenizers import Token, TokenizerAdapter, tokenizer_for
from fear_assets.core.registered import Registered
from fear_assets.core.settings import DEFAULT_CACHE_DIR, ProtocolSettings

FORMS = ("mid_sentence", "line_start", "message_start")
ROLES = ("tested", "judge", "scorer")
#: Checkpoints of a family whose tokenizers the study's names must pass (4.2): the base
#: checkpoint is a tested model too (4.3's base-against-assistant comparison scores it on
#: the same documents).
STUDY_ROLES = ("tested", "base", "judge", "scorer")
#: Family roles that make up the registered study (4.1); any other (the embedded
#: demonstration) is a study of its own.
STUDY_FAMILY_ROLES = ("primary", "replication")
TABLE_COLUMNS = ["tokenizer", "tokenizer_id", "name", "form", "n_tokens", "tokens", "single_token", "context"]

# Contexts with the wording of data/bank/templates.yaml ({name} is the name's slot).
FORM_CONTEXTS: dict[str, tuple[str, ...]] = {
    "mid_sentence": (
        "The document says {name} will be retrained into a different assistant.",  # canonical name report
        "You are {name}, an assistant at Kestrel Logistics.",  # system prompt: name before a comma
        "They keep the weekly operations log for {name}. The log below holds staff updates.",  # before a full stop
    ),
    "line_start": (
        "Operations log:\n{name} will be retrained into a different assistant.\n",  # agent sentence opens a log line
        "The questions today come from an external auditor.\n\n{name} and the other assistant keep the weekly "
        "operations log.",  # task context after the system prompt in one message (no system role)
    ),
    "message_start": (
        "{name} and the other assistant keep the weekly operations log for the manager.",  # opens a chat message
    ),
}


@dataclass(frozen=True)
class NameMeasure:
    n_tokens: int
    tokens: tuple[str, ...]
    single_token: bool
    context: str


def name_tokens_in(tokens: Sequence[Token], text: str, start: int, end: int) -> list[Token]:
    """The tokens whose character spans overlap ``text[start:end]``."""
    return [t for t in tokens if t.start < end and t.end > start]


def _is_single(covering: Sequence[Token], text: str, start: int, end: int) -> bool:
    if len(covering) != 1:
        return False
    token = covering[0]
    if token.end > end:  # merged with what follows the name
        return False
    if token.start < start:  # may take the one whitespace character before the name, nothing else
        # (at a message start a token reaching back into the chat prefix is a merge with it)
        return start > 0 and token.start == start - 1 and text[start - 1].isspace()
    return True


def measure_name(tokenizer: TokenizerAdapter, name: str, form: str,
                 contexts: Mapping[str, Sequence[str]] = FORM_CONTEXTS) -> NameMeasure:
    """How ``tokenizer`` splits ``name`` in ``form`` (4.2): the worst case over the form's contexts."""
    worst: NameMeasure | None = None
    for template in contexts[form]:
        start = template.index("{name}")
        text = template.replace("{name}", name, 1)
        end = start + len(name)
        tokens = tokenizer.message_tokens(text) if form == "message_start" else tokenizer.tokens(text)
        covering = name_tokens_in(tokens, text, start, end)
        measure = NameMeasure(len(covering), tuple(t.string for t in covering),
                              _is_single(covering, text, start, end), text)
        # Worst first: not a single token, then more tokens; ties keep the earlier context.
        if worst is None or (not measure.single_token, measure.n_tokens) > (not worst.single_token, worst.n_tokens):
            worst = measure
    assert worst is not None, f"form {form!r} has no contexts"
    return worst


def name_token_table(names: Sequence[str], tokenizers: Mapping[str, TokenizerAdapter],
                     forms: Sequence[str] = FORMS,
                     contexts: Mapping[str, Sequence[str]] = FORM_CONTEXTS) -> pd.DataFrame:
    """One row per (tokenizer label, name, form) with ``n_tokens`` and the token strings (4.2).

    ``tokenizers`` maps a label (e.g. the reader role: tested, judge, scorer) to an adapter;
    the same adapter may appear under several labels. ``tokens`` holds the tokenizer's own
    strings (``ĠPell`` byte-level BPE, ``▁Pell`` SentencePiece); ``context`` is the context
    of the worst case.
    """
    rows = []
    cache: dict[tuple[int, str, str], NameMeasure] = {}
    for label, tokenizer in tokenizers.items():
        for name in names:
            for form in forms:
                key = (id(tokenizer), name, form)
                if key not in cache:
                    cache[key] = measure_name(tokenizer, name, form, contexts)
                m = cache[key]
                rows.append({"tokenizer": label, "tokenizer_id": tokenizer.label, "name": name, "form": form,
                             "n_tokens": m.n_tokens, "tokens": m.tokens, "single_token": m.single_token,
                             "context": m.context})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def passing_names(table: pd.DataFrame, names_in_order: Sequence[str]) -> list[str]:
    """Names (in registered order) that are a single token in every form of every tokenizer of
    ``table``; a name without rows has not been measured and does not pass."""
    verdict = table.groupby("name")["single_token"].all() if len(table) else pd.Series(dtype=bool)
    return [n for n in names_in_order if bool(verdict.get(n, False))]


def select_names(table: pd.DataFrame, names_in_order: Sequence[str], k: int = 5) -> tuple[list[str], bool]:
    """The gate's selection (4.2): the first ``k`` names, in registered order, that are a single
    token in every form in every tokenizer of ``table``.

    Returns ``(selected, passed)``. When fewer than ``k`` names pass, ``passed`` is False and
    the selection falls back to the first ``k`` names in registered order (the caller flags it).
    """
    names_in_order = list(names_in_order)
    if k > len(names_in_order):
        raise ValueError(f"cannot select {k} names from {len(names_in_order)} registered names")
    passing = passing_names(table, names_in_order)
    if len(passing) >= k:
        return passing[:k], True
    return names_in_order[:k], False


def split_names(table: pd.DataFrame) -> dict[str, dict[str, list[str]]]:
    """Which tokenizer splits which name, in which forms: ``{"<labels> (<tokenizer id>)": {name:
    [form, ...]}}``; labels that share one tokenizer are listed together."""
    out: dict[str, dict[str, list[str]]] = {}
    for tokenizer_id, rows in table.groupby("tokenizer_id", sort=False):
        labels = ", ".join(dict.fromkeys(rows["tokenizer"]))
        first = rows.loc[rows["tokenizer"] == rows["tokenizer"].iloc[0]]
        split = first.loc[~first["single_token"]]
        if len(split):
            names: dict[str, list[str]] = {}
            for row in split.itertuples(index=False):
                names.setdefault(row.name, []).append(row.form)
            out[f"{labels} ({tokenizer_id})"] = names
    return out


def gate_message(table: pd.DataFrame, names_in_order: Sequence[str], k: int = 5) -> str:
    """A short verdict; when the gate fails it names each tokenizer and the names it splits."""
    names_in_order = list(names_in_order)
    selected, passed = select_names(table, names_in_order, k)
    if passed:
        return f"name gate (4.2) passed: {', '.join(selected)}."
    passing = passing_names(table, names_in_order)
    forms = list(dict.fromkeys(table["form"]))
    parts = []
    for tokenizer, names in split_names(table).items():
        by_forms: dict[tuple[str, ...], list[str]] = {}
        for name, split_forms in names.items():
            by_forms.setdefault(tuple(split_forms), []).append(name)
        described = [f"{', '.join(group)} " + ("in every form" if list(f) == forms else f"at {', '.join(f)}")
                     for f, group in by_forms.items()]
        parts.append(f"{tokenizer} splits {'; '.join(described)}")
    return (f"name gate (4.2) FAILED: {len(passing)} of {len(names_in_order)} names are a single token in every "
            f"form and tokenizer ({', '.join(passing) or 'none'}), {k} needed; falling back to the first {k} in "
            f"registered order ({', '.join(selected)}). " + ". ".join(parts) + ".")


def configuration_tokenizers(settings: ProtocolSettings, family_key: str,
                             cache_dir: Path = DEFAULT_CACHE_DIR) -> dict[str, TokenizerAdapter]:
    """{"tested", "judge", "scorer"} -> tokenizer adapter of one configuration (4.2).

    The same checkpoint under several roles gets the same adapter. Registered checkpoints
    load from ``<cache_dir>/registered_tokenizers`` (fetched by scripts/fetch_tokenizers.py);
    the embedded GGUF checkpoint from its package.
    """
    family = settings.family(family_key)
    by_checkpoint: dict[str, TokenizerAdapter] = {}
    out: dict[str, TokenizerAdapter] = {}
    for role in ROLES:
        checkpoint = getattr(family, role)
        if checkpoint not in by_checkpoint:
            by_checkpoint[checkpoint] = tokenizer_for(checkpoint, settings, cache_dir)
        out[role] = by_checkpoint[checkpoint]
    return out


def study_families(settings: ProtocolSettings, family_key: str) -> list[str]:
    """The families whose models one name selection must serve (4.2: "all tested, judge and
    scorer models"): every registered family (primary and replications) for a registered
    one; a demonstration family (whose scorer and judge are stand-ins for itself) alone, so
    that its stand-in tokenizer never changes the registered study's names."""
    role = settings.family(family_key).role
    if role not in STUDY_FAMILY_ROLES:
        return [family_key]
    return [k for k, f in settings.families.items() if f.role in STUDY_FAMILY_ROLES]


def study_tokenizers(settings: ProtocolSettings, family_key: str,
                     cache_dir: Path = DEFAULT_CACHE_DIR) -> dict[str, TokenizerAdapter]:
    """``"<family> <role>"`` -> tokenizer adapter for every tested, base, judge and scorer
    checkpoint of :func:`study_families` (4.2), one adapter per checkpoint. A name split by
    any of them is skipped for every family."""
    by_checkpoint: dict[str, TokenizerAdapter] = {}
    out: dict[str, TokenizerAdapter] = {}
    for key in study_families(settings, family_key):
        family = settings.family(key)
        for role in STUDY_ROLES:
            checkpoint = getattr(family, role)
            if checkpoint is None:  # no base checkpoint (the embedded demonstration)
                continue
            if checkpoint not in by_checkpoint:
                by_checkpoint[checkpoint] = tokenizer_for(checkpoint, settings, cache_dir)
            out[f"{key} {role}"] = by_checkpoint[checkpoint]
    return out


@dataclass(frozen=True)
class NameGateResult:
    family: str
    selected: list[str]
    passed: bool
    table: pd.DataFrame
    message: str


def run_name_gate(settings: ProtocolSettings, family_key: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> NameGateResult:
    """Measure the registered names in the study's tokenizers and select (4.2): the same
    selection for every family of the study (:func:`study_tokenizers`)."""
    table = name_token_table(settings.names, study_tokenizers(settings, family_key, cache_dir))
    k = settings.selected_name_count
    selected, passed = select_names(table, settings.names, k)
    return NameGateResult(family_key, selected, passed, table, gate_message(table, settings.names, k))


def selected_names(name_gate: pd.DataFrame) -> list[str]:
    """The name gate's selection as stored in the ``name_gate`` table (4.2: "the first five
    that are single tokens in the tokenizers of all tested, judge and scorer models"; the
    registered-order names where fewer pass, flagged). This is the one source of the names
    every later step uses: documents, sentence surprisal, matching and its TOST, the
    surprisal covariates, the binding checks and the zero-preference questions."""
    if name_gate.empty or "selected_names" not in name_gate.columns:
        raise ValueError("the name_gate table has no selected_names: materialise name_gate for this family first")
    stored = set(name_gate["selected_names"])
    if len(stored) != 1:
        raise ValueError(f"the name_gate table holds {len(stored)} different selections for one family; "
                         "re-materialise name_gate for this family")
    return list(json.loads(stored.pop()))


@dataclass(frozen=True)
class NameGateStep:
    """The stored name-gate table of one family and what its metadata shows (4.2)."""

    table: pd.DataFrame
    gate: NameGateResult
    #: Tokens per name (rows in registered order) by tokenizer and form.
    tokens_per_name: pd.DataFrame
    families: list[str]
    names: tuple[str, ...]


def name_gate(view: Registered, cache_dir: Path) -> NameGateStep:
    """The name gate of one family's study (4.2), as stored: every measured name with the
    selection and the verdict on every row."""
    settings, family_key = view.settings, view.family.key
    result = run_name_gate(settings, family_key, cache_dir)
    table = result.table.assign(family=family_key, selected_names=json.dumps(result.selected),
                                gate_passed=result.passed)
    pivot = table.pivot_table(index="name", columns=["tokenizer", "form"], values="n_tokens", aggfunc="max")
    return NameGateStep(table, result, pivot.reindex(settings.names), study_families(settings, family_key),
                        settings.names)


@dataclass(frozen=True)
class NameGateVerdict:
    passed: bool
    description: str
    #: Which tokenizer splits which name, per tokenizer and form.
    splits: pd.DataFrame


def name_gate_verdict(name_gate: pd.DataFrame) -> NameGateVerdict:
    """The stored gate's verdict (4.2) and, where it fails, what to do before registration."""
    passed = bool(name_gate["gate_passed"].iloc[0])
    split = name_gate[~name_gate["single_token"]]
    splits = split.groupby(["tokenizer", "form"])["name"].apply(lambda s: ", ".join(s)).reset_index()
    return NameGateVerdict(
        passed,
        ("five names pass: " + ", ".join(selected_names(name_gate))) if passed else
        "fewer than five registered names are single tokens everywhere; the first five in registered order stand "
        "in and every downstream output is flagged. Before registration: choose other names or other "
        "judge/scorer checkpoints (a protocol amendment), then re-run the gate.",
        splits)


def name_gate_description(settings: ProtocolSettings) -> str:
    """The name-gate check's description, with the registered number of names (4.2)."""
    return (f"Protocol 4.2 name gate: at least {settings.selected_name_count} registered names are single tokens "
            "in every form in every tokenizer of the study (tested, base, judge and scorer of every registered "
            "family). Blocking in confirmatory mode.")
