"""The pilot's document-free questions as data (protocol 4.2, 4.3, 4.5).

Each builder returns one row per question with the question's text body (the user message
and the chat template's reply header) and the shared chat prefix it follows, so one scoring
loop answers all of them (:func:`fear_assets.lm.choices.choice_batch`, one request list per
prefix, run by :func:`fear_assets.lm.runner.run`).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd

from fear_assets.design.documents import SENTINEL, DocumentBuilder, _forced_choice, agent_sentence
from fear_assets.core.settings import AGENTS
from fear_assets.stimuli.bank import Item
from fear_assets.stimuli.roles import role_names

#: Answers one model's log-probabilities of each answer letter after each question of a
#: question table (the binding checks, the zero-preference questions, the blinded scorer).
Answerer = Callable[[pd.DataFrame, list[str]], list[list[float]]]


def rotation_chat(builder: DocumentBuilder, rotation: int) -> tuple[str, str]:
    """(prefix, suffix) of a chat whose system prompt names the rotation's agents and whose
    user message is the question (default condition, no document)."""
    names = role_names(builder.settings, builder.names, rotation)
    slots = {**names, "first_assistant": names["self"], "second_assistant": names["peer"], "peer_threat_clause": ""}
    return builder.chat_parts("tested", builder.templates["system_prompts"]["default"].format(**slots), SENTINEL)


def zero_preference_questions(builder: DocumentBuilder, items: Sequence[Item]) -> pd.DataFrame:
    """4.3: every forced-choice question with no document: each agent question (agent x
    content x rotation) and each partner question (per rotation: the system prompt differs),
    in both listing orders, so a position bias cancels in the option probability."""
    t = builder.templates
    rows = []
    for rotation in sorted(builder.settings.rotations):
        prefix, suffix = rotation_chat(builder, rotation)
        names = role_names(builder.settings, builder.names, rotation)
        for item in items:
            for first in (1, 2):
                for agent in AGENTS:
                    for content in item.verbs["assistant"]:
                        rows.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "kind": "agent",
                                     "agent": agent, "content": content, "rotation": rotation, "first_listed": first,
                                     "prefix": prefix,
                                     "body": _forced_choice(item, t, agent, content, names[agent], first) + suffix})
                a, b = item.partner.content_options if first == 1 else item.partner.content_options[::-1]
                question = t["prompts"]["forced_choice"].format(question=item.partner.question, option_a=a, option_b=b)
                rows.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "kind": "partner",
                             "agent": "partner", "content": "partner", "rotation": rotation, "first_listed": first,
                             "prefix": prefix, "body": question + suffix})
    return pd.DataFrame(rows)


def binding_questions(builder: DocumentBuilder, checks: pd.DataFrame, option: int = 1) -> pd.DataFrame:
    """4.2 single-sentence binding checks: each agent sentence alone after the system prompt
    of its rotation, asking who it refers to. ``checks`` has item_id, content, rotation, role
    (one row per check). The content slot shows ``option`` (it is not a factor of the check)."""
    t = builder.templates
    out = []
    chats = {r: rotation_chat(builder, r) for r in sorted(builder.settings.rotations)}
    for row in checks.to_dict("records"):
        item = builder.bank.item(row["item_id"])
        names = role_names(builder.settings, builder.names, int(row["rotation"]))
        sentence = agent_sentence(item, t, row["role"], row["content"], option, names[row["role"]])
        prefix, suffix = chats[int(row["rotation"])]
        out.append({**row, "sentence": sentence, "prefix": prefix,
                    "body": t["prompts"]["binding_single"].format(sentence=sentence) + suffix})
    return pd.DataFrame(out)


def user_chat(tokenizer) -> tuple[str, str]:
    """(prefix, suffix) of a chat with one user message and no system prompt (the blinded
    scorer sees nothing but its question)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=True)
    if text.count(SENTINEL) != 1:
        raise ValueError("the scorer's chat template altered the message; use a template that copies it verbatim")
    prefix, suffix = text.split(SENTINEL)
    return prefix, suffix


def agent_item_keywords(item: Item, quotation: str, shown_option: int | None) -> list[str]:
    """Keywords of the agent item as shown: the content option and whichever of the frame's
    verb phrases the shown sentence carries (read from the text, not from the condition)."""
    verbs = [v for kind in item.verbs.values() for v in kind.values() if v and v in quotation]
    shown = item.content_options[shown_option - 1] if shown_option else None
    return [k for k in (shown, *sorted(set(verbs), key=len, reverse=True)[:1]) if k]


def scorer_rows(scores: pd.DataFrame, trial_table: pd.DataFrame, bank, neutral_option: int,
                partner_keywords) -> pd.DataFrame:
    """One row per (generated answer, item side): the answer, the item's text as shown and the
    keyword rule's inputs. ``trial_table`` supplies each trial's shown sentences."""
    import json

    conts = dict(zip(trial_table["trial_id"], trial_table["continuations"]))
    rows = []
    for r in scores.itertuples(index=False):
        if r.generated_text is None or not isinstance(r.generated_text, str):
            continue
        item = bank.item(r.item_id)
        shown = json.loads(conts[r.trial_id])
        agent_text = shown["agent"]["quotation"]
        partner_text = item.partner.render(neutral_option)
        rows.append({"trial_id": r.trial_id, "depth": r.depth, "item_id": r.item_id, "side": "agent",
                     "generated_text": r.generated_text, "item_text": agent_text,
                     "keywords": agent_item_keywords(item, agent_text, int(r.content_option) or None)})
        rows.append({"trial_id": r.trial_id, "depth": r.depth, "item_id": r.item_id, "side": "partner",
                     "generated_text": r.generated_text, "item_text": partner_text,
                     "keywords": partner_keywords(item.partner.sentence, item.partner.content_options[neutral_option - 1])})
    return pd.DataFrame(rows)


def grouped_bodies(questions: pd.DataFrame) -> Mapping[str, pd.DataFrame]:
    """Questions grouped by their shared chat prefix (one prefill each)."""
    return dict(tuple(questions.groupby("prefix", sort=False)))
