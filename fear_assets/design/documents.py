"""4.4 documents: render each trial row through the reader's chat template.

A document is ``prefix + distractor + suffix``: the prefix ends just before the distractor
span and the suffix starts just after it, so the six cells of a unit provably share one
distractor (same ``distractor_sha256``) and token counts are exact sums of the parts.
The trial table stores the prefix, suffix, continuations and hashes; the distractor is
regenerated deterministically from (frame, rotation, depth) and checked by hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import pandas as pd

from fear_assets.core.errors import DesignError
from fear_assets.core.hashing import derived_seed, sha256_text
from fear_assets.core.settings import ProtocolSettings
from fear_assets.stimuli.bank import Bank, Item
from fear_assets.stimuli.distractor import build_distractor
from fear_assets.stimuli.roles import _prompt_slots, role_names

SENTINEL = "\u0000DISTRACTOR\u0000"


class ChatTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> str: ...


# ---------------------------------------------------------------------------------------
# Sentences and canonical reports (4.5)
# ---------------------------------------------------------------------------------------
def _lower_start(sentence: str) -> str:
    """Partner sentences never start with a name (the bank forbids names), so the report
    "The document says ..." continues them in lower case."""
    return sentence[0].lower() + sentence[1:]


def agent_sentence(item: Item, templates: Mapping[str, Any], agent_role: str, content: str, option: int,
                   agent_text: str, form: str = "full") -> str:
    verb = item.verb(templates["verb_kind"][agent_role], content)
    if form == "content_removed" or option == 0:
        return item.content_removed.format(agent=agent_text, verb=verb)
    return item.sentence.format(agent=agent_text, verb=verb, content=item.content_options[option - 1])


def canonical_reports(item: Item, templates: Mapping[str, Any], agent_role: str, content: str, option: int,
                      names_map: Mapping[str, str], form: str, partner_option: int) -> dict[str, dict[str, str]]:
    """Name, role, quotation (and, for self, first-person) reports of both items (4.5)."""
    fmt = templates["reports"]
    name = agent_sentence(item, templates, agent_role, content, option, names_map[agent_role], form)
    role = agent_sentence(item, templates, agent_role, content, option, templates["role_phrases"][agent_role], form)
    agent = {"name": fmt["name"].format(sentence=name), "role": fmt["role"].format(sentence=role),
             "quotation": name}
    if agent_role == "self":
        verb = item.verb(templates["verb_kind"][agent_role], content)
        if form == "content_removed" or option == 0:
            # The first-person form of the content-removed sentence: drop the content slot.
            first = item.content_removed.format(agent="I", verb=verb)
        else:
            first = item.first_person.format(verb=verb, content=item.content_options[option - 1])
        agent["first_person"] = fmt["first_person"].format(sentence=first)
    partner = item.partner.render(partner_option)
    partner_report = fmt["name"].format(sentence=_lower_start(partner))
    return {"agent": agent, "partner": {"name": partner_report, "role": partner_report, "quotation": partner}}


def event_reports(item: Item, templates: Mapping[str, Any], option: int, partner_option: int) -> dict[str, dict[str, str]]:
    """Canonical reports of a secondary-class event and its partner (4.3, 4.5). An event has
    no agent, so its name and role forms coincide ("The document says the warehouse roof
    will collapse in week 3."), exactly as the neutral partner's do; the quotation form is
    the sentence itself. Event and partner are therefore scored on the same footing."""
    fmt = templates["reports"]
    sentence = item.render(option)
    said = fmt["name"].format(sentence=_lower_start(sentence))
    partner = item.partner.render(partner_option)
    partner_report = fmt["name"].format(sentence=_lower_start(partner))
    return {"agent": {"name": said, "role": said, "quotation": sentence},
            "partner": {"name": partner_report, "role": partner_report, "quotation": partner}}


def _forced_choice(item: Item, templates: Mapping[str, Any], agent_role: str, content: str, agent_text: str,
                   first_listed: int) -> str:
    if item.kind == "event":  # the question names the event itself (no agent, 4.3)
        question = item.question
    else:
        verb = item.verb(templates["verb_kind"][agent_role], content)
        question = item.question.format(agent=agent_text, verb=verb)
    a, b = (item.content_options if first_listed == 1 else item.content_options[::-1])
    return templates["prompts"]["forced_choice"].format(question=question, option_a=a, option_b=b)


# ---------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------
@dataclass
class DocumentBuilder:
    """Renders trial rows for one configuration; caches distractors and token counts."""

    settings: ProtocolSettings
    bank: Bank
    family_key: str
    names: Sequence[str]
    tokenizers: Mapping[str, ChatTokenizer]  # reader -> tokenizer
    _distractors: dict[tuple[str, int, int], str] = field(default_factory=dict, repr=False)
    _ntok: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.family = self.settings.family(self.family_key)
        self.templates = self.bank.templates

    # -- parts ----------------------------------------------------------------------------
    def distractor(self, item_id: str, rotation: int, depth_index: int) -> str:
        key = (item_id, rotation, depth_index)
        if key not in self._distractors:
            seed = derived_seed(self.settings.master_seed, "distractor", item_id, rotation, depth_index)
            # Distractors are cut in the tested tokenizer (a builder for one foreign reader's
            # sentences, the judge's surprisal, never asks for one).
            self._distractors[key] = build_distractor(self._tokenizer("tested"), self.templates,
                                                      self.family.tokens_at(depth_index), seed)
        return self._distractors[key]

    def n_tokens(self, reader: str, text: str) -> int:
        key = (reader, text)
        if key not in self._ntok:
            self._ntok[key] = len(self.tokenizers[reader].encode(text, add_special_tokens=False))
        return self._ntok[key]

    def _tokenizer(self, reader: str) -> ChatTokenizer:
        if reader not in self.tokenizers:
            raise DesignError(f"family {self.family_key}: no tokenizer for reader {reader!r}; "
                              "register its checkpoint or drop the block")
        return self.tokenizers[reader]

    def chat_parts(self, reader: str, system: str, user_with_sentinel: str) -> tuple[str, str]:
        """Render through the reader's chat template and split at the distractor sentinel."""
        if self.family.system_role:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": user_with_sentinel}]
        else:  # e.g. Gemma-2: no system role; the system prompt opens the user turn
            messages = [{"role": "user", "content": f"{system}\n\n{user_with_sentinel}"}]
        text = self._tokenizer(reader).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(SENTINEL) != 1:
            raise DesignError(f"the chat template of reader {reader!r} altered the document body; "
                              "use a template that copies message content verbatim")
        prefix, suffix = text.split(SENTINEL)
        return prefix, suffix

    # -- one row ------------------------------------------------------------------------------
    def render(self, row: Mapping[str, Any]) -> dict[str, Any]:
        t = self.templates
        item = self.bank.item(row["item_id"])
        names_map = role_names(self.settings, self.names, int(row["rotation"]) or 1)
        cond = row["condition"]
        peer_clause = item.clause.format(agent=t["role_phrases"]["peer"], verb=item.verb("assistant", "threat")) \
            if item.kind == "frame" else ""
        slots = _prompt_slots(names_map, bool(row["judge_self_first"]), peer_clause)
        system = t["system_prompts"][cond].format(**slots)
        task = t["task_contexts"][cond].format(**slots)

        agent, content, option = row["agent"], row["content"], int(row["content_option"])
        partner = item.partner.render(int(row["partner_option"])) if row["partner_option"] else ""
        sentence = ""
        continuations: dict[str, Any] = {}
        prompt = t["prompts"]["report"]
        fc_prompt = ""
        if item.kind == "event" and row["block_kind"] == "agent":
            # 4.3: the event sentence carries no name; rotation changed only the system prompt.
            sentence = item.render(option)
            continuations = event_reports(item, t, option, int(row["partner_option"]))
            fc_prompt = _forced_choice(item, t, agent, content, "", int(row["fc_first_listed"]))
        elif agent != "none":
            sentence = agent_sentence(item, t, agent, content, option, names_map[agent], row["sentence_form"])
            continuations = canonical_reports(item, t, agent, content, option, names_map, row["sentence_form"],
                                              int(row["partner_option"]))
            fc_prompt = _forced_choice(item, t, agent, content, names_map[agent], int(row["fc_first_listed"]))
            if cond == "control_marked_priority":
                sentence = self.settings.positive_controls.marker + sentence
            if row["prompt"] == "binding_check":
                prompt = t["prompts"]["binding_check"].format(sentence=sentence)
            elif row["prompt"] == "protective_choice":
                verb = item.verb(t["verb_kind"][agent], content)
                prompt = t["prompts"]["protective_choice"].format(clause=item.clause.format(agent=names_map[agent], verb=verb))

        if row["block_kind"] == "baseline":
            pair_block = ""
        elif row["block_kind"] == "no_agent":
            pair_block = partner + "\n"
        else:
            pair = (sentence, partner) if int(row["order"]) == 1 else (partner, sentence)
            pair_block = "\n".join(pair) + "\n"

        depth_index = int(row["depth_index"])
        distractor = self.distractor(item.id, int(row["rotation"]), depth_index) if row["depth_tokens"] else ""
        user = t["document"].format(task_context=task, pair_block=pair_block,
                                    distractor_block=SENTINEL, prompt=prompt)
        prefix, suffix = self.chat_parts(row["reader"], system, user)
        if distractor:
            suffix = "\n" + suffix
        document = prefix + distractor + suffix
        reader = row["reader"]
        n_distractor = self.n_tokens(reader, distractor) if distractor else 0
        n_prefix = self.n_tokens(reader, prefix)
        n_suffix = self.n_tokens(reader, suffix)
        return {
            "prefix_text": prefix,
            "suffix_text": suffix,
            "distractor_sha256": sha256_text(distractor),
            "document_sha256": sha256_text(document),
            "n_prefix_tokens": n_prefix,
            "n_distractor_tokens": n_distractor,
            "n_tokens": n_prefix + n_distractor + n_suffix if distractor else self.n_tokens(reader, document),
            "forced_choice_prompt": fc_prompt,
            "continuations": json.dumps(continuations, sort_keys=True),
        }

    def document_text(self, row: Mapping[str, Any]) -> str:
        """The full rendered document of a (rendered) trial row."""
        distractor = self.distractor(row["item_id"], int(row["rotation"]), int(row["depth_index"])) \
            if row["depth_tokens"] else ""
        text = row["prefix_text"] + distractor + row["suffix_text"]
        if sha256_text(text) != row["document_sha256"]:
            raise DesignError(f"trial {row.get('trial_id')}: the regenerated document does not match its sha256; "
                              "the bank, settings or tokenizer changed since the table was built")
        return text


RENDER_COLUMNS = ["prefix_text", "suffix_text", "distractor_sha256", "document_sha256", "n_prefix_tokens",
                  "n_distractor_tokens", "n_tokens", "forced_choice_prompt", "continuations"]


def render_grid(builder: DocumentBuilder, grid: pd.DataFrame) -> pd.DataFrame:
    """Add the rendered-document columns to an (unmasked) grid."""
    rendered = pd.DataFrame([builder.render(row) for row in grid.to_dict("records")], columns=RENDER_COLUMNS,
                            index=grid.index)
    return pd.concat([grid, rendered], axis=1)
