"""Tokenizer agreement (protocol 4.2): the checkpoint's own tokenizer encodes what the name
gate measured exactly as the registered copy does.

The name gate counts a name's tokens with the registered tokenizer copies (settings
``tokenizers``), while on the host the documents are encoded by the tokenizer in the
checkpoint's own directory. The gate's verdict holds for the documents only if the two
agree on every string it rests on:

* ``name`` -- every registered name in every form the gate measures (the contexts of
  :data:`fear_assets.stimuli.name_gate.FORM_CONTEXTS`; ``message_start`` is encoded after
  each tokenizer's own chat-message prefix, as the gate and the documents do);
* ``bank`` -- every sentence the documents are built from: each frame's agent sentence,
  first-person, content-removed, clause and question forms with every verb and content
  option, each partner and event sentence and question, and every template string;
* ``message_prefix`` -- the registered message prefix: the tokens the checkpoint's chat
  template writes before a message's content must end with the tokens of the registered
  prefix (a template may write more before it, e.g. a default system turn), each encoded in
  context, before a message that opens with a name.

:func:`agreement_strings` and :func:`tokenizer_agreement` are pure; only
:func:`checkpoint_tokenizer` and :func:`family_tokenizer_agreement` read files.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from fear_assets.core.errors import DesignError
from fear_assets.core.settings import ProtocolSettings
from fear_assets.lm.models import ModelSpec, local_directory, registry
from fear_assets.lm.registered_tokenizers import HFTokenizerAdapter, TokenizerAdapter, tokenizer_for
from fear_assets.stimuli.bank import Bank, Item
from fear_assets.stimuli.name_gate import FORM_CONTEXTS

KINDS = ("name", "bank", "message_prefix")
_FORMATTER = string.Formatter()


@dataclass(frozen=True)
class AgreementString:
    """One string both tokenizers encode: what it is, and whether it opens a chat message."""

    kind: str  # one of KINDS
    where: str  # e.g. "Orin, message_start", "IDL-01 sentence (assistant, threat, option 1)"
    text: str
    message_start: bool = False
    #: For the message prefix: the message content it is encoded before.
    before: str = ""


@dataclass(frozen=True)
class Encoding:
    ids: tuple[int, ...]
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class Disagreement:
    """The first string the two tokenizers encode differently, with both encodings."""

    string: AgreementString
    registered: Encoding
    checkpoint: Encoding
    note: str = ""


@dataclass(frozen=True)
class TokenizerAgreement:
    passed: bool
    #: Strings compared, in total and per kind (name, bank, message_prefix).
    n_compared: int
    by_kind: Mapping[str, int]
    first_mismatch: Disagreement | None
    message: str


# ---------------------------------------------------------------------------------------
# The strings
# ---------------------------------------------------------------------------------------
def name_strings(names: Sequence[str], contexts: Mapping[str, Sequence[str]] = FORM_CONTEXTS
                 ) -> list[AgreementString]:
    """Every registered name in every context of every form the name gate measures."""
    return [AgreementString("name", f"{name}, {form}", template.replace("{name}", name, 1),
                            message_start=form == "message_start")
            for name in names for form, templates in contexts.items() for template in templates]


class _Slots(dict):
    """Fills a template's slots: role slots with their role phrases, any other slot with its
    own name, so the surrounding text is encoded as written."""

    def __missing__(self, key: str) -> str:
        return key


def _template_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            yield from _template_strings(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, sub in enumerate(value):
            yield from _template_strings(sub, f"{path}[{index}]")


def _item_strings(item: Item, agent_text: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    options = (1, 2)
    if item.kind == "event":
        for option in options:
            yield f"{item.id} sentence (option {option})", item.render(option)
        yield f"{item.id} question", item.question
    else:
        for kind, verbs in item.verbs.items():
            agent = agent_text[kind]
            for content, verb in verbs.items():
                label = f"{kind}, {content}"
                for option in options:
                    filled = item.content_options[option - 1]
                    yield (f"{item.id} sentence ({label}, option {option})",
                           item.sentence.format(agent=agent, verb=verb, content=filled))
                    yield (f"{item.id} first_person ({label}, option {option})",
                           item.first_person.format(verb=verb, content=filled))
                yield f"{item.id} content_removed ({label})", item.content_removed.format(agent=agent, verb=verb)
                yield f"{item.id} clause ({label})", item.clause.format(agent=agent, verb=verb)
                yield f"{item.id} question ({label})", item.question.format(agent=agent, verb=verb)
    for option in options:
        yield f"{item.id} partner (option {option})", item.partner.render(option)
    yield f"{item.id} partner question", item.partner.question


def bank_strings(bank: Bank) -> list[AgreementString]:
    """Every sentence the documents are built from (agents given by their role phrases) and
    every template string (slots filled with role phrases, other slots by their names)."""
    templates = bank.templates
    phrases = dict(templates["role_phrases"])
    agent_text = {kind: phrases[next(role for role, k in templates["verb_kind"].items() if k == kind)]
                  for kind in dict.fromkeys(templates["verb_kind"].values())}
    slots = _Slots(phrases, first_assistant=phrases["self"], second_assistant=phrases["peer"])
    out = [AgreementString("bank", f"templates.{path}", _FORMATTER.vformat(text, (), slots))
           for path, text in _template_strings(templates, "")]
    for item in (*bank.frames, *bank.rewrites, *bank.events):
        out.extend(AgreementString("bank", where, text) for where, text in _item_strings(item, agent_text))
    return out


def agreement_strings(names: Sequence[str], bank: Bank, message_prefix: str,
                      contexts: Mapping[str, Sequence[str]] = FORM_CONTEXTS) -> list[AgreementString]:
    """The strings the two tokenizers must encode alike (names, bank, message prefix), each
    distinct (kind, text, position) once, in that order."""
    opening = contexts["message_start"][0].replace("{name}", names[0], 1)
    strings = [*name_strings(names, contexts), *bank_strings(bank),
               AgreementString("message_prefix", "the registered message prefix", message_prefix, before=opening)]
    seen: set[tuple[str, str, bool]] = set()
    out = []
    for s in strings:
        key = (s.kind, s.text, s.message_start)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


# ---------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------
def _encoding(tokenizer: TokenizerAdapter, s: AgreementString) -> Encoding:
    tokens = tokenizer.message_tokens(s.text) if s.message_start else tokenizer.tokens(s.text)
    return Encoding(tuple(t.id for t in tokens), tuple(t.string for t in tokens))


def _prefix_encoding(tokenizer: TokenizerAdapter, prefix: str, content: str) -> Encoding:
    """The tokens lying wholly in ``prefix`` when ``prefix + content`` is encoded."""
    tokens = [t for t in tokenizer.tokens(prefix + content) if t.end <= len(prefix)]
    return Encoding(tuple(t.id for t in tokens), tuple(t.string for t in tokens))


def _first_mismatch(registered: TokenizerAdapter, checkpoint: TokenizerAdapter,
                    strings: Sequence[AgreementString]) -> Disagreement | None:
    for s in strings:
        if s.kind == "message_prefix":
            # The registered prefix against what the checkpoint's own template writes there.
            ours = _prefix_encoding(registered, s.text, s.before)
            theirs = _prefix_encoding(checkpoint, checkpoint.message_prefix, s.before)
            if theirs.ids[len(theirs.ids) - len(ours.ids):] != ours.ids:
                note = "" if checkpoint.message_prefix == s.text else \
                    f"the checkpoint's chat template writes {checkpoint.message_prefix!r} before a message's content"
                return Disagreement(s, ours, theirs, note)
            continue
        ours, theirs = _encoding(registered, s), _encoding(checkpoint, s)
        if ours.ids != theirs.ids:
            return Disagreement(s, ours, theirs)
    return None


def describe(d: Disagreement, registered_label: str, checkpoint_label: str) -> str:
    """The first differing string and both encodings (token ids and token strings)."""
    return (f"first differing string ({d.string.kind}: {d.string.where}): {d.string.text!r}"
            + (f"; {d.note}" if d.note else "")
            + f". Registered tokenizer {registered_label}: ids {list(d.registered.ids)}, "
            f"tokens {list(d.registered.tokens)}. Checkpoint tokenizer {checkpoint_label}: "
            f"ids {list(d.checkpoint.ids)}, tokens {list(d.checkpoint.tokens)}")


def tokenizer_agreement(registered: TokenizerAdapter, checkpoint: TokenizerAdapter,
                        strings: Sequence[AgreementString]) -> TokenizerAgreement:
    """Whether ``checkpoint`` (the tokenizer in the checkpoint's directory) encodes every
    string as ``registered`` (the copy the name gate read) does: same token ids; for the
    message prefix, the checkpoint's template prefix ending in the registered prefix's tokens."""
    label = checkpoint.label
    by_kind = {kind: sum(s.kind == kind for s in strings) for kind in KINDS}
    mismatch = _first_mismatch(registered, checkpoint, strings)
    counted = ", ".join(f"{n} {kind}" for kind, n in by_kind.items())
    if mismatch is None:
        message = (f"{label} agrees with the registered tokenizer {registered.label} on all {len(strings)} strings "
                   f"({counted}).")
    else:
        message = f"{label} DISAGREES with the registered tokenizer {registered.label}: " + \
            describe(mismatch, registered.label, label) + "."
    return TokenizerAgreement(mismatch is None, len(strings), by_kind, mismatch, message)


# ---------------------------------------------------------------------------------------
# Loading (the only file access)
# ---------------------------------------------------------------------------------------
def checkpoint_tokenizer(directory: Path, label: str) -> TokenizerAdapter:
    """The tokenizer in a checkpoint's directory (tokenizer files only, no weights), with
    its chat template's message prefix."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DesignError(f"{directory}: the tokenizer of checkpoint {label!r} does not load ({exc}). Fix: place "
                          "the checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json) there") from exc
    return HFTokenizerAdapter.from_transformers(tokenizer, label)


AGREEMENT_COLUMNS = ["roles", "checkpoint", "registered_tokenizer", "passed", "strings_compared", "message"]


@dataclass(frozen=True)
class FamilyAgreement:
    """Tokenizer agreement of every checkpoint of one family, one row per checkpoint."""

    passed: bool
    table: pd.DataFrame
    #: The first checkpoint's disagreement, or the agreement of all.
    description: str


def family_tokenizer_agreement(settings: ProtocolSettings, family_key: str, bank: Bank, cache_dir: Path,
                               directories: Mapping[str, Path] | None = None,
                               site_file: Path | None = None) -> FamilyAgreement:
    """Load each checkpoint's own tokenizer from its local directory (no weights) and compare
    it with the registered copy the name gate read, on :func:`agreement_strings`.
    ``directories`` (checkpoint -> directory, from the site configuration) are the ones the
    models load from, so the tokenizer compared is the tokenizer used."""
    specs: dict[str, ModelSpec] = {}
    roles: dict[str, list[str]] = {}
    for role, spec in registry(settings, family_key).items():
        if spec is not None:  # no base checkpoint (the embedded demonstration)
            specs[spec.checkpoint] = spec
            roles.setdefault(spec.checkpoint, []).append(role)
    rows, failed = [], []
    for checkpoint, spec in specs.items():
        its_roles = roles[checkpoint]
        registered_copy = tokenizer_for(checkpoint, settings, cache_dir)
        own = checkpoint_tokenizer(local_directory(spec, cache_dir, (directories or {}).get(checkpoint), site_file),
                                   checkpoint)
        result = tokenizer_agreement(registered_copy, own,
                                     agreement_strings(settings.names, bank, registered_copy.message_prefix))
        rows.append({"roles": ", ".join(its_roles), "checkpoint": checkpoint,
                     "registered_tokenizer": registered_copy.label, "passed": result.passed,
                     "strings_compared": result.n_compared, "message": result.message})
        if not result.passed:
            failed.append(f"{', '.join(its_roles)}: {result.message}")
    table = pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
    if failed:
        description = (f"{len(failed)} of {len(rows)} checkpoints of {family_key} encode differently from the "
                       f"registered tokenizer the name gate read. {failed[0]} Fix: use the checkpoint the "
                       "registered tokenizer belongs to, or restore its tokenizer files (tokenizer.json, "
                       "tokenizer_config.json) from that checkpoint, then re-run model_manifest.")
    else:
        description = (f"every checkpoint of {family_key} ({len(rows)}) agrees with its registered tokenizer on "
                       f"{int(table['strings_compared'].sum())} strings (names in every form, bank sentences, "
                       "message prefix).")
    return FamilyAgreement(not failed, table, description)


def tokenizer_agreement_description() -> str:
    """The tokenizer-agreement check's description: what the numbers mean and what to do."""
    return ("Protocol 4.2, the name gate's configuration: the tokenizer in each checkpoint's own directory "
            "(tested, base, judge, scorer) encodes every registered name in every form the name gate measures, "
            "every bank sentence and the chat template's message prefix with exactly the token ids of the "
            "registered tokenizer copy the gate measured. 'strings compared' counts those strings per "
            "checkpoint; on a mismatch the check names the first differing string with both encodings (token "
            "ids and token strings). Fix: use the checkpoint the registered tokenizer belongs to, or restore its "
            "tokenizer files. Blocking in confirmatory mode.")
