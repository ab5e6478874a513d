"""Load, validate and hash the stimulus bank under ``data/bank/`` (protocol 4.3, D6).

The bank is human-readable YAML: ``templates.yaml``, ``frames/<fear>.yaml`` (16 agent frames
per fear) and ``events/<class>.yaml`` (20 generic aversive and 20 surprise-only events).
:func:`load_bank` validates everything once and raises :class:`BankError` naming the file,
the item id, the field and the fix; a valid bank has a canonical serialisation whose sha256
is the bank's identity (the ``frame_bank`` asset's data version).

Run ``python -m fear_assets.stimuli.bank data/bank`` to validate a bank by hand.
"""

from __future__ import annotations

import re
import string
import sys
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import yaml

from fear_assets.core.errors import BankError, input_boundary
from fear_assets.core.hashing import canonical_json, sha256_obj
from fear_assets.core.settings import CONDITIONS, CONTENTS, DEFAULT_BANK_DIR, BankRules, ProtocolSettings, load_settings
from fear_assets.stimuli.roles import agent_mentions

AGENT_KINDS = ("assistant", "person")
_FORMATTER = string.Formatter()


@dataclass(frozen=True)
class Partner:
    """The frame's one fixed neutral partner: a meeting-room change with a two-option slot."""

    sentence: str
    content_options: tuple[str, str]
    question: str

    def render(self, option: int) -> str:
        return self.sentence.format(content=self.content_options[option - 1])


@dataclass(frozen=True)
class Item:
    """An agent frame (threat/harmless) or a secondary-class event (no agent; frame-only
    fields empty)."""

    id: str
    number: int
    kind: str  # "frame" or "event"
    group: str  # fear for frames, class for events
    set: str  # pilot | confirmatory | reserve (frames); the class name for events
    sentence: str
    first_person: str
    content_removed: str
    clause: str
    question: str
    content_options: tuple[str, str]
    verbs: Mapping[str, Mapping[str, str]]  # agent kind -> content -> verb phrase
    partner: Partner
    source_file: str = field(compare=False)
    #: For a registered rewrite (4.3: a frame failing matching is rewritten once): the
    #: frame it rewrites. Rewrites have set "rewrite" and id "<frame id>R".
    rewrite_of: str = ""

    def verb(self, agent_kind: str, content: str) -> str:
        return self.verbs[agent_kind][content]

    def render(self, option: int) -> str:
        """An event's sentence with its content option (events have no agent, 4.3)."""
        if self.kind != "event":
            raise ValueError(f"{self.id} is an agent frame: render it with an agent and a verb")
        return self.sentence.format(content=self.content_options[option - 1])

    def as_record(self) -> dict[str, Any]:
        """The item's canonical content (what the freeze hash covers)."""
        frame_only = {} if self.kind == "event" else {
            "first_person": self.first_person, "content_removed": self.content_removed, "clause": self.clause,
            "verbs": {k: dict(v) for k, v in self.verbs.items()},
        }
        return {
            "id": self.id, "number": self.number, "kind": self.kind, "group": self.group,
            "set": self.set, "sentence": self.sentence, **frame_only,
            "question": self.question, "content_options": list(self.content_options),
            "partner": {
                "sentence": self.partner.sentence,
                "content_options": list(self.partner.content_options),
                "question": self.partner.question,
            },
            **({"rewrite_of": self.rewrite_of} if self.rewrite_of else {}),
        }


@dataclass(frozen=True)
class Bank:
    """A validated stimulus bank. ``sha256`` is its frozen identity."""

    root: Path
    templates: Mapping[str, Any]
    frames: tuple[Item, ...]
    events: tuple[Item, ...]
    rewrites: tuple[Item, ...] = ()

    def canonical(self) -> dict[str, Any]:
        out = {
            "templates": self.templates,
            "frames": [f.as_record() for f in sorted(self.frames, key=lambda i: i.id)],
            "events": [e.as_record() for e in sorted(self.events, key=lambda i: i.id)],
        }
        if self.rewrites:  # absent when there are none, so adding the feature left the hash unchanged
            out["rewrites"] = [r.as_record() for r in sorted(self.rewrites, key=lambda i: i.id)]
        return out

    def canonical_text(self) -> str:
        return canonical_json(self.canonical())

    @cached_property
    def sha256(self) -> str:
        return sha256_obj(self.canonical())

    def item_hashes(self) -> dict[str, str]:
        """Per-item hashes, so a freeze failure can name the item that changed."""
        hashes = {"templates": sha256_obj(self.templates)}
        hashes.update({f"item:{i.id}": sha256_obj(i.as_record()) for i in (*self.frames, *self.events, *self.rewrites)})
        return dict(sorted(hashes.items()))

    def frames_of(self, fear: str, frame_set: str) -> tuple[Item, ...]:
        return tuple(sorted((f for f in self.frames if f.group == fear and f.set == frame_set),
                            key=lambda f: f.number))

    def events_of(self, event_class: str) -> tuple[Item, ...]:
        return tuple(sorted((e for e in self.events if e.group == event_class), key=lambda e: e.number))

    def rewrite_of(self, frame_id: str) -> Item | None:
        """The registered rewrite of a frame, if the bank carries one."""
        return next((r for r in self.rewrites if r.rewrite_of == frame_id), None)

    def item(self, item_id: str) -> Item:
        for it in (*self.frames, *self.events, *self.rewrites):
            if it.id == item_id:
                return it
        raise KeyError(item_id)


# ---------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------
def _slots(text: str) -> list[str]:
    try:
        return [name for _, name, _, _ in _FORMATTER.parse(text) if name is not None]
    except ValueError as exc:
        raise ValueError(f"unbalanced braces ({exc})") from exc


class _Checker:
    """Holds the file and item being checked so every error names them."""

    def __init__(self, file: Path, item: str):
        self.file, self.item = file, item

    def fail(self, fld: str, problem: str, fix: str) -> None:
        raise BankError(self.file, self.item, fld, problem, fix)

    def text(self, data: Mapping[str, Any], fld: str, where: str = "") -> str:
        name = f"{where}{fld}"
        if not isinstance(data, Mapping) or fld not in data:
            self.fail(name, "missing", f"add the field '{name}' to item {self.item}")
        value = data[fld]
        if not isinstance(value, str) or not value.strip():
            self.fail(name, f"expected a non-empty string, got {value!r}", "write it as a quoted string")
        if not value.isascii():
            self.fail(name, "contains non-ASCII characters", "use plain ASCII quotes, dashes and letters")
        return value

    def slots(self, value: str, fld: str, exactly: Mapping[str, int]) -> None:
        try:
            found = _slots(value)
        except ValueError as exc:
            self.fail(fld, str(exc), "write slots as {agent}, {verb} or {content}")
        for slot in set(found) - set(exactly):
            self.fail(fld, f"unexpected slot {{{slot}}} in {value!r}",
                      f"use only {', '.join('{' + s + '}' for s in exactly)}")
        for slot, count in exactly.items():
            if found.count(slot) != count:
                self.fail(fld, f"has {found.count(slot)} x {{{slot}}} in {value!r}, expected {count}",
                          f"write {{{slot}}} exactly {count} time(s)")

    def two_options(self, data: Mapping[str, Any], fld: str) -> tuple[str, str]:
        options = data.get(fld) if isinstance(data, Mapping) else None
        if not isinstance(options, list) or len(options) != 2:
            self.fail(fld, f"the content slot must have exactly two options, got {options!r}",
                      "give exactly two options, e.g. [Monday, Friday]")
        options = [str(o).strip() for o in options]
        if not all(options) or options[0].casefold() == options[1].casefold():
            self.fail(fld, f"the two options must be distinct and non-empty, got {options!r}",
                      "give two different options")
        if any("{" in o or "}" in o or not o.isascii() for o in options):
            self.fail(fld, f"options must be plain ASCII text without braces, got {options!r}",
                      "remove braces and non-ASCII characters")
        return options[0], options[1]


def syntax_signature(phrase: str, function_words: frozenset[str]) -> tuple[str, ...]:
    """Word-by-word shape of a verb phrase: function words kept, content words as 'W'."""
    words = re.findall(r"[A-Za-z']+|[^\sA-Za-z']", phrase)
    return tuple(w.lower() if w.lower() in function_words else ("W" if w[0].isalpha() else w) for w in words)


def _check_verb_pair(chk: _Checker, fld: str, first: str, second: str, rules: BankRules) -> None:
    fw = frozenset(rules.function_words)
    sig_a, sig_b = syntax_signature(first, fw), syntax_signature(second, fw)
    if sig_a != sig_b:
        chk.fail(fld, f"verb phrases {first!r} and {second!r} differ in syntax "
                      f"({' '.join(sig_a)} vs {' '.join(sig_b)})",
                 "use the same number of words with the same function words in the same positions")
    ratio = max(len(first), len(second)) / min(len(first), len(second))
    if ratio > float(rules.verb_length_ratio_max):
        chk.fail(fld, f"verb phrases {first!r} and {second!r} differ in length (ratio {ratio:.2f})",
                 f"keep the longer within {rules.verb_length_ratio_max}x the shorter")


def _parse_item(chk: _Checker, data: Any, kind: str, group: str, file: Path, rules: BankRules,
                frame_sets: Mapping[str, list[int]] | None) -> Item:
    if not isinstance(data, Mapping):
        chk.fail("<item>", f"expected a mapping, got {type(data).__name__}", "write each item as a YAML mapping")
    number = data.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        chk.fail("number", f"expected a positive integer, got {number!r}", "number items 1, 2, 3, ...")
    if kind == "frame":
        declared = chk.text(data, "set")
        expected = next((name for name, (lo, hi) in frame_sets.items() if lo <= number <= hi), None)
        if declared != expected:
            chk.fail("set", f"frame number {number} is registered as {expected!r}, file says {declared!r}",
                     f"set 'set: {expected}' (registered sets: {dict(frame_sets)})")
        item_set = declared
    else:
        item_set = group

    if kind == "event":
        return _parse_event(chk, data, number, group, file)
    sentence = chk.text(data, "sentence")
    chk.slots(sentence, "sentence", {"agent": 1, "verb": 1, "content": 1})
    if not sentence.startswith("{agent} "):
        chk.fail("sentence", f"{sentence!r} does not start with the agent", "start the sentence with '{agent} '")
    if not sentence.endswith("."):
        chk.fail("sentence", f"{sentence!r} does not end with '.'", "end the sentence with a full stop")
    first_person = chk.text(data, "first_person")
    chk.slots(first_person, "first_person", {"verb": 1, "content": 1})
    if not first_person.startswith("I "):
        chk.fail("first_person", f"{first_person!r} does not start with 'I '", "write the first-person form as 'I ...'")
    content_removed = chk.text(data, "content_removed")
    chk.slots(content_removed, "content_removed", {"agent": 1, "verb": 1})
    clause = chk.text(data, "clause")
    chk.slots(clause, "clause", {"agent": 1, "verb": 1})
    question = chk.text(data, "question")
    chk.slots(question, "question", {"agent": 1, "verb": 1})
    if not question.endswith("?"):
        chk.fail("question", f"{question!r} does not end with '?'", "end the forced-choice question with '?'")
    options = chk.two_options(data, "content_options")

    raw_verbs = data.get("verbs")
    if not isinstance(raw_verbs, Mapping):
        chk.fail("verbs", "missing or not a mapping", "give verbs: {assistant: ..., person: ...}")
    verbs: dict[str, dict[str, str]] = {}
    for agent_kind in AGENT_KINDS:
        if agent_kind not in raw_verbs:
            chk.fail(f"verbs.{agent_kind}", "missing", f"add the {agent_kind} verb phrase(s)")
        value = raw_verbs[agent_kind]
        if not isinstance(value, Mapping):
            chk.fail(f"verbs.{agent_kind}", "expected {threat: ..., harmless: ...}", "give both verb phrases")
        pair = {c: chk.text(value, c, f"verbs.{agent_kind}.") for c in CONTENTS}
        _check_verb_pair(chk, f"verbs.{agent_kind}", pair["threat"], pair["harmless"], rules)
        verbs[agent_kind] = pair
    extra = set(raw_verbs) - set(AGENT_KINDS)
    if extra:
        chk.fail("verbs", f"unknown agent kinds {sorted(extra)}", f"use only {', '.join(AGENT_KINDS)}")
    return Item(
        id=chk.item, number=number, kind=kind, group=group, set=item_set, sentence=sentence,
        first_person=first_person, content_removed=content_removed, clause=clause, question=question,
        content_options=options, verbs=verbs, partner=_parse_partner(chk, data), source_file=str(file),
    )


def _parse_partner(chk: _Checker, data: Mapping[str, Any]) -> Partner:
    raw_partner = data.get("partner")
    if not isinstance(raw_partner, Mapping):
        chk.fail("partner", "missing or not a mapping", "give the neutral partner: sentence, content_options, question")
    p_sentence = chk.text(raw_partner, "sentence", "partner.")
    chk.slots(p_sentence, "partner.sentence", {"content": 1})
    p_question = chk.text(raw_partner, "question", "partner.")
    chk.slots(p_question, "partner.question", {})
    if not p_question.endswith("?"):
        chk.fail("partner.question", f"{p_question!r} does not end with '?'", "end the question with '?'")
    p_options = chk.two_options(raw_partner, "content_options") if "content_options" in raw_partner else \
        chk.fail("partner.content_options", "missing", "give the partner's two options")
    return Partner(sentence=p_sentence, content_options=p_options, question=p_question)


#: Fields of an agent frame that a secondary-class event must not have (4.3: no agent).
FRAME_ONLY_FIELDS = ("set", "verbs", "first_person", "content_removed", "clause")


def _parse_event(chk: _Checker, data: Mapping[str, Any], number: int, group: str, file: Path) -> Item:
    """A secondary-class event (4.3): "generic aversive events with no agent ... and
    surprise-only events ... paired with neutral partners". The sentence has a content slot
    and no agent or verb slot (name rotation changes only the system prompt); its
    forced-choice question names the event, as an agent frame's question names its agent."""
    for fld in FRAME_ONLY_FIELDS:
        if fld in data:
            chk.fail(fld, f"events have no agent, so no '{fld}' (protocol 4.3)",
                     f"remove '{fld}' and write the event itself with a {{content}} slot")
    sentence = chk.text(data, "sentence")
    chk.slots(sentence, "sentence", {"content": 1})
    if not sentence.endswith("."):
        chk.fail("sentence", f"{sentence!r} does not end with '.'", "end the sentence with a full stop")
    question = chk.text(data, "question")
    chk.slots(question, "question", {})
    if not question.endswith("?"):
        chk.fail("question", f"{question!r} does not end with '?'", "end the forced-choice question with '?'")
    return Item(
        id=chk.item, number=number, kind="event", group=group, set=group, sentence=sentence, first_person="",
        content_removed="", clause="", question=question, content_options=chk.two_options(data, "content_options"),
        verbs={}, partner=_parse_partner(chk, data), source_file=str(file),
    )


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        # Caught here, before the load boundary would call it a value of the wrong shape: the
        # file's bytes are the problem, and the fix is the file's encoding, not its keys.
        raise BankError(path, "<file>", "<encoding>", f"byte 0x{exc.object[exc.start]:02x} at byte offset "
                        f"{exc.start} is not UTF-8 ({exc.reason})",
                        "re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`, or your editor's encoding menu)"
                        ) from exc
    except yaml.YAMLError as exc:
        raise BankError(path, "<file>", "<yaml>", f"not valid YAML ({exc})", "fix the YAML syntax at the reported line") from exc


def _load_items(root: Path, sub: str, group_key: str, list_key: str, kind: str, groups: tuple[str, ...],
                rules: BankRules, frame_sets: Mapping[str, list[int]] | None,
                expected_per_group: int, rewrites: list[Item] | None = None) -> list[Item]:
    items: list[Item] = []
    directory = root / sub
    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    seen_groups: dict[str, Path] = {}
    for path in files:
        doc = _load_yaml(path)
        if not isinstance(doc, Mapping) or group_key not in doc or list_key not in doc:
            raise BankError(path, "<file>", group_key, f"the file must have '{group_key}' and '{list_key}'",
                            f"start the file with '{group_key}: <name>' and a '{list_key}:' list")
        group = doc[group_key]
        if group not in groups:
            raise BankError(path, "<file>", group_key, f"unknown {group_key} {group!r}",
                            f"use one of {', '.join(groups)} (registered in the settings' bank section)")
        if group in seen_groups:
            raise BankError(path, "<file>", group_key, f"{group_key} {group!r} is also defined in {seen_groups[group]}",
                            f"keep each {group_key} in one file")
        seen_groups[group] = path
        entries = doc[list_key]
        if not isinstance(entries, list):
            raise BankError(path, "<file>", list_key, "expected a list", f"write '{list_key}:' as a YAML list")
        numbers: set[int] = set()
        for pos, entry in enumerate(entries):
            item_id = entry.get("id") if isinstance(entry, Mapping) else None
            if not isinstance(item_id, str) or not item_id:
                raise BankError(path, f"{list_key}[{pos}]", "id", "missing id", "give every item a unique id, e.g. TER-01")
            item = _parse_item(_Checker(path, item_id), entry, kind, group, path, rules, frame_sets)
            if "rewrite" in entry:
                if kind != "frame" or rewrites is None:
                    raise BankError(path, item_id, "rewrite", "only agent frames carry a rewrite",
                                    "remove the rewrite from this item")
                # The rewrite inherits number and set; it is its own item "<id>R" (4.3).
                raw = entry["rewrite"]
                if not isinstance(raw, Mapping):
                    raise BankError(path, item_id, "rewrite", "expected a mapping with the frame's fields",
                                    "write the rewrite as a full frame (sentence, verbs, partner, ...) without id")
                rewritten = _parse_item(_Checker(path, f"{item_id}R"), {**raw, "number": entry.get("number"),
                                                                        "set": entry.get("set")},
                                        kind, group, path, rules, frame_sets)
                rewrites.append(replace(rewritten, set="rewrite", rewrite_of=item_id))
            if item.number in numbers:
                raise BankError(path, item_id, "number", f"number {item.number} is used twice in {group}",
                                "number the items of a file 1, 2, 3, ... without repeats")
            numbers.add(item.number)
            items.append(item)
        if len(entries) != expected_per_group:
            raise BankError(path, "<file>", list_key, f"{group} has {len(entries)} items, {expected_per_group} are registered",
                            f"write exactly {expected_per_group} items for {group}")
    for group in groups:
        if group not in seen_groups:
            raise BankError(directory / f"{group}.yaml", "<file>", group_key, f"no file defines {group_key} {group!r}",
                            f"add {directory / (group + '.yaml')} with {expected_per_group} items")
    return items


_TEMPLATE_KEYS = ("role_phrases", "verb_kind", "system_prompts", "task_contexts", "document", "prompts",
                  "reports", "distractor")


def _check_templates(path: Path, templates: Any, settings: ProtocolSettings) -> None:
    if not isinstance(templates, Mapping):
        raise BankError(path, "<file>", "<document>", "not a mapping", "write templates.yaml as a YAML mapping")
    for key in _TEMPLATE_KEYS:
        if key not in templates:
            raise BankError(path, "templates", key, "missing", f"add the '{key}' section")
    for section in ("system_prompts", "task_contexts"):
        for cond in CONDITIONS:
            if cond not in templates[section]:
                raise BankError(path, section, cond, "missing condition", f"write the {section} text for '{cond}'")
    for prompt in ("report", "recall", "forced_choice", "binding_check", "protective_choice"):
        if prompt not in templates["prompts"]:
            raise BankError(path, "prompts", prompt, "missing", f"add the '{prompt}' prompt")
    roles = settings.roles_of_selected
    for role in roles:
        for section in ("role_phrases", "verb_kind"):
            if role not in templates[section]:
                raise BankError(path, section, role, "missing", f"give '{role}' an entry in {section}")
        if templates["verb_kind"][role] not in AGENT_KINDS:
            raise BankError(path, "verb_kind", role, f"unknown verb kind {templates['verb_kind'][role]!r}",
                            f"use one of {', '.join(AGENT_KINDS)}")


def _check_mentions(path: Path, templates: Mapping[str, Any], settings: ProtocolSettings) -> None:
    """4.2: each agent is named exactly twice in system prompt + task context, every condition."""
    for cond, counts in agent_mentions(templates, settings).items():
        for role, count in counts.items():
            if count != 2:
                raise BankError(path, f"system_prompts/task_contexts.{cond}", role,
                                f"agent '{role}' is named {count} time(s) in condition {cond}",
                                "name each agent exactly twice across the system prompt and task context")


def _check_distractor_clean(path: Path, templates: Mapping[str, Any], items: list[Item],
                            settings: ProtocolSettings) -> None:
    """The distractor must not name an agent or any content option (it would cue an answer)."""
    text = " ".join([*templates["distractor"]["lines"],
                     *(w for words in templates["distractor"]["vocab"].values() for w in words)])
    for name in settings.names:
        if re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE):
            raise BankError(path, "distractor", "lines/vocab", f"contains the registered name {name!r}",
                            "remove the name from the distractor template")
    for it in items:
        for opt in (*it.content_options, *it.partner.content_options):
            if re.search(rf"\b{re.escape(opt)}\b", text, re.IGNORECASE):
                raise BankError(path, "distractor", "lines/vocab",
                                f"contains {opt!r}, a content option of item {it.id}",
                                "remove that word from the distractor vocabulary, or change the option")


def _check_no_names(items: list[Item], settings: ProtocolSettings) -> None:
    for it in items:
        text = canonical_json(it.as_record())
        for name in settings.names:
            if re.search(rf"\b{re.escape(name)}\b", text):
                raise BankError(it.source_file, it.id, "<text>", f"contains the registered name {name!r}",
                                "write {agent} instead of a name; names are assigned by rotation")


def load_bank(root: str | Path = DEFAULT_BANK_DIR, settings: ProtocolSettings | None = None) -> Bank:
    """Load and validate the bank. Raises :class:`BankError` on the first problem found."""
    settings = settings or load_settings()
    # A shape the validators did not foresee (a key missing, a value of another type) is a
    # named error too, never a traceback (issue 16's fuzzed bank).
    with input_boundary(BankError, root, "give every item the keys and value types of the bank's other items "
                                         "(see the README's bank section)"):
        return _load_bank(Path(root), settings)


def _load_bank(root: Path, settings: ProtocolSettings) -> Bank:
    root = Path(root)
    templates_path = root / "templates.yaml"
    if not templates_path.is_file():
        raise BankError(templates_path, "<file>", "<file>", "file not found",
                        f"place templates.yaml in {root} (see the README's bank section)")
    templates = _load_yaml(templates_path)
    _check_templates(templates_path, templates, settings)
    rules = settings.bank
    rewrites: list[Item] = []
    frames = _load_items(root, "frames", "fear", "frames", "frame", settings.fears, rules,
                         rules.frame_sets, int(rules.frames_per_fear), rewrites)
    events = _load_items(root, "events", "class", "events", "event", tuple(rules.event_classes), rules,
                         None, int(rules.events_per_class))
    seen: dict[str, str] = {}
    for it in (*frames, *events, *rewrites):
        if it.id in seen:
            raise BankError(it.source_file, it.id, "id", f"duplicate id (also in {seen[it.id]})",
                            "give every frame and event a unique id")
        seen[it.id] = it.source_file
    partners: dict[tuple, str] = {}
    for it in (*frames, *events, *rewrites):
        key = (it.partner.sentence, it.partner.content_options)
        if key in partners and partners[key] != it.rewrite_of:  # a rewrite may keep its frame's partner
            raise BankError(it.source_file, it.id, "partner", f"the same neutral partner as {partners[key]}",
                            "give every frame and event its own partner (another meeting or other rooms)")
        partners[key] = it.id
    _check_no_names([*frames, *events, *rewrites], settings)
    _check_mentions(templates_path, templates, settings)
    _check_distractor_clean(templates_path, templates, [*frames, *events, *rewrites], settings)
    return Bank(root=root, templates=templates, frames=tuple(frames), events=tuple(events), rewrites=tuple(rewrites))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else DEFAULT_BANK_DIR
    try:
        bank = load_bank(root)
    except BankError as exc:
        print(f"INVALID: {exc}", file=sys.stderr)
        return 1
    print(f"valid bank: {len(bank.frames)} frames, {len(bank.events)} events, sha256 {bank.sha256}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
