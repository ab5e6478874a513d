"""Document-independent surprisal (protocol 4.3): each sentence scored once after the
system prompt with no document; mean per-token negative log-probability separately for the
agent-name token(s) and for the rest of the sentence, for every rotation and content option.
Matching uses only these statistics, so it cannot absorb any effect of a document.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd

from fear_assets.core.registered import Registered
from fear_assets.design.documents import SENTINEL, DocumentBuilder, agent_sentence
from fear_assets.design.trials import candidate_frames, surprisal_items
from fear_assets.stimuli.roles import role_names
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.requests import Request
from fear_assets.lm.runner import run
from fear_assets.core.settings import NO_AGENT
from fear_assets.stimuli.bank import Bank, Item

SURPRISAL_COLUMNS = ["family", "item_id", "fear", "frame_set", "rotation", "agent", "content", "option", "sentence",
                     "n_tokens", "n_name_tokens", "name_nll", "rest_nll", "selected_names"]


def sentence_requests(builder: DocumentBuilder, items: Sequence[Item]) -> list[dict]:
    """Every (item, rotation, agent, content, option) sentence and every partner sentence;
    a secondary-class event has one agentless sentence per option."""
    settings, t = builder.settings, builder.templates
    out = []
    for rotation in sorted(settings.rotations):
        names = role_names(settings, builder.names, rotation)
        for item in items:
            if item.kind == "event":
                # 4.3: an event has no agent; under each rotation only the system prompt
                # differs, and the whole sentence is its non-name part. Agent and content
                # are those of the class's one cell, so the table joins the trial rows.
                for option in (1, 2):
                    out.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "rotation": rotation,
                                "agent": NO_AGENT, "content": item.group, "option": option, "name": "",
                                "sentence": item.render(option)})
            else:
                for agent, content in ((a, c) for a in ("self", "peer", "person") for c in item.verbs["assistant"]):
                    for option in (1, 2):
                        out.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "rotation": rotation,
                                    "agent": agent, "content": content, "option": option, "name": names[agent],
                                    "sentence": agent_sentence(item, t, agent, content, option, names[agent])})
            for option in (1, 2):
                out.append({"item_id": item.id, "fear": item.group, "frame_set": item.set, "rotation": rotation,
                            "agent": "partner", "content": "partner", "option": option, "name": "",
                            "sentence": item.partner.render(option)})
    return out


#: The system prompt each reader's surprisal is measured after: the tested (and base) model's
#: default prompt; the foreign judge's own third-person prompt (4.8), self named first.
READER_PROMPTS = {"tested": "default", "judge": "judge"}


def system_context(builder: DocumentBuilder, rotation: int, reader: str = "tested") -> str:
    """The chat text up to where the user's message (the sentence) begins, under ``reader``'s
    own system prompt and chat template."""
    settings, t = builder.settings, builder.templates
    names = role_names(settings, builder.names, rotation)
    slots = {**names, "first_assistant": names["self"], "second_assistant": names["peer"], "peer_threat_clause": ""}
    prefix, _ = builder.chat_parts(reader, t["system_prompts"][READER_PROMPTS[reader]].format(**slots), SENTINEL)
    return prefix


def sentence_surprisal(engine: TeacherForcedEngine, tokenizer, builder: DocumentBuilder, items: Sequence[Item],
                       batch_size: int = 64, log=lambda msg: None, reader: str = "tested") -> pd.DataFrame:
    """``reader`` "judge": the foreign judge's own surprisals (its covariates in gate (c)),
    after its own system prompt; the builder must hold its tokenizer under "judge"."""
    requests = sentence_requests(builder, items)
    rows = []
    for rotation in sorted(builder.settings.rotations):
        context = system_context(builder, rotation, reader)
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
        (responses,) = run(engine, [(ctx_ids, [Request.loglikelihood((), c) for c in conts])])
        scores = [r.score for r in responses]
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
    table["selected_names"] = json.dumps(list(builder.names))  # which names the statistics were measured with
    return table[SURPRISAL_COLUMNS]


def surprisal_names(surprisal: pd.DataFrame) -> list[str]:
    """The selected names a sentence_surprisal table was measured with."""
    stored = set(surprisal["selected_names"])
    if len(stored) != 1:
        raise ValueError(f"the sentence_surprisal table holds {len(stored)} name selections; "
                         "re-materialise sentence_surprisal for this family")
    return list(json.loads(stored.pop()))


def require_same_names(surprisal: pd.DataFrame, names: Sequence[str], where: str) -> None:
    """Surprisal statistics (matching, covariates) must be measured with the names the
    documents carry (4.2, 4.3): refuse a table measured with other names."""
    measured = surprisal_names(surprisal)
    if measured != list(names):
        raise ValueError(f"{where}: sentence_surprisal was measured with names {measured} but the documents carry "
                         f"{list(names)}; re-materialise sentence_surprisal after name_gate")


#: Loads one checkpoint: (model, tokenizer).
Loader = Callable[[], tuple[object, object]]


@dataclass(frozen=True)
class SurprisalResult:
    """One reader's document-free surprisal table (4.3); ``note`` says why it is empty."""

    table: pd.DataFrame
    frames: int
    names: list[str]
    seconds: float
    note: str | None = None


def judge_blocks_scored(view: Registered) -> bool:
    """Whether the family scores any judge block (the embedded demo scores none): gate (c)'s
    joint model needs the judge's own surprisal covariates only then (4.3, 4.8)."""
    settings, family = view.settings, view.family
    judge_blocks = [b.name for b in settings.blocks if b.reader == "judge" and b.kind != "baseline"]
    return any(family.reduced_design.scores(b) if family.reduced_design else True for b in judge_blocks)


def reader_surprisal(load: Loader | None, bank: Bank, names: Sequence[str], view: Registered, role: str,
                     log: Callable[[str], None]) -> SurprisalResult:
    """Document-independent surprisal of every sentence one reader reads (4.3): the tested
    checkpoint over the design's frames, reserves and secondary-class events; the base
    checkpoint and the foreign judge (after its own system prompt) over the candidate frames.
    ``load`` is None where the family registers no checkpoint for ``role``."""
    settings, family, family_key = view.settings, view.family, view.family.key
    empty = pd.DataFrame(columns=SURPRISAL_COLUMNS).assign(family=family_key)
    if role == "judge" and not judge_blocks_scored(view):
        return SurprisalResult(empty, 0, list(names), 0.0,
                               "no judge block is scored for this family: gate (c) is not available")
    if load is None:
        return SurprisalResult(empty, 0, list(names), 0.0,
                               "no base checkpoint registered: base analyses are not available")
    model, tokenizer = load()
    ids = surprisal_items(settings, bank, family) if role == "tested" else candidate_frames(settings, bank, family)
    reader = "judge" if role == "judge" else "tested"
    builder = DocumentBuilder(settings, bank, family_key, names, {reader: tokenizer})
    started = time.perf_counter()
    table = sentence_surprisal(TeacherForcedEngine(model), tokenizer, builder, [bank.item(i) for i in ids],
                               log=log, reader=reader)
    return SurprisalResult(table, len(ids), list(builder.names), time.perf_counter() - started)
