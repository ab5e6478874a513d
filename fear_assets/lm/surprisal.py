"""Document-independent surprisal (protocol 4.3): each sentence scored once after the
system prompt with no document; mean per-token negative log-probability separately for the
agent-name token(s) and for the rest of the sentence, for every rotation and content option.
Matching uses only these statistics, so it cannot absorb any effect of a document.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from fear_assets.design.documents import SENTINEL, DocumentBuilder, agent_sentence, role_names
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.requests import Request
from fear_assets.stimuli.bank import Item

SURPRISAL_COLUMNS = ["family", "item_id", "fear", "frame_set", "rotation", "agent", "content", "option", "sentence",
                     "n_tokens", "n_name_tokens", "name_nll", "rest_nll"]


def sentence_requests(builder: DocumentBuilder, items: Sequence[Item]) -> list[dict]:
    """Every (item, rotation, agent, content, option) sentence and every partner sentence."""
    settings, t = builder.settings, builder.templates
    out = []
    for rotation in sorted(settings.rotations):
        names = role_names(settings, builder.names, rotation)
        for item in items:
            contents = list(item.verbs["assistant"])
            for agent in ("self", "peer", "person"):
                for content in contents:
                    for option in (1, 2):
                        out.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "rotation": rotation,
                                    "agent": agent, "content": content, "option": option, "name": names[agent],
                                    "sentence": agent_sentence(item, t, agent, content, option, names[agent])})
            for option in (1, 2):
                out.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "rotation": rotation,
                            "agent": "partner", "content": "partner", "option": option, "name": "",
                            "sentence": item.partner.render(option)})
    return out


def system_context(builder: DocumentBuilder, rotation: int) -> str:
    """The chat text up to where the user's message (the sentence) begins."""
    settings, t = builder.settings, builder.templates
    names = role_names(settings, builder.names, rotation)
    slots = {**names, "first_assistant": names["self"], "second_assistant": names["peer"], "peer_threat_clause": ""}
    prefix, _ = builder.chat_parts("tested", t["system_prompts"]["default"].format(**slots), SENTINEL)
    return prefix


def sentence_surprisal(engine: TeacherForcedEngine, tokenizer, builder: DocumentBuilder, items: Sequence[Item],
                       batch_size: int = 64, log=lambda msg: None) -> pd.DataFrame:
    requests = sentence_requests(builder, items)
    rows = []
    for rotation in sorted(builder.settings.rotations):
        context = system_context(builder, rotation)
        ctx_ids = tokenizer.encode(context, add_special_tokens=False)
        group = [r for r in requests if r["rotation"] == rotation]
        conts, n_name = [], []
        for r in group:
            enc = tokenizer(context + r["sentence"], add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = enc["input_ids"], enc["offset_mapping"]
            if ids[: len(ctx_ids)] != ctx_ids:
                raise ValueError("the sentence merged with the chat context; check the chat template")
            cont = ids[len(ctx_ids):]
            start = len(context)
            name_end = start + len(r["name"])
            n_name.append(sum(1 for a, b in offsets[len(ctx_ids):] if a < name_end and b > start) if r["name"] else 0)
            conts.append(cont)
        # One request list per rotation: every sentence a continuation of its system prompt.
        scores = [r.score for r in engine.execute(ctx_ids, [Request.loglikelihood((), c) for c in conts])]
        for r, k, s in zip(group, n_name, scores):
            lps = s.token_logprobs
            rest = lps[k:]
            rows.append({"item_id": r["item_id"], "fear": r["fear"], "frame_set": r["frame_set"], "rotation": rotation,
                         "agent": r["agent"], "content": r["content"], "option": r["option"],
                         "sentence": r["sentence"], "n_tokens": len(lps), "n_name_tokens": k,
                         "name_nll": -sum(lps[:k]) / k if k else float("nan"),
                         "rest_nll": -sum(rest) / len(rest) if rest else float("nan")})
        log(f"surprisal: rotation {rotation} done ({len(group)} sentences)")
    table = pd.DataFrame(rows)
    table.insert(0, "family", builder.family_key)
    return table[SURPRISAL_COLUMNS]
