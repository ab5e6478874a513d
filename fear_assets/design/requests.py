"""Document requests as data (protocol 4.5, Appendix B): what each document of a partition
reads, decided here, in the design stage, never in the engine.

:func:`build_requests` turns a partition of the trial table into document requests: for
each document its branch texts (report, recall, forced choice, or the block's own prompt),
the continuations to score on each branch, the choices to read, whether to generate, and
the sentence spans whose attention mass is read. Distractor-only baselines score the union
of their dependent trials' continuations; a reduced design's ``branches`` restrict what a
block reads. :mod:`fear_assets.design.document_scores` turns each one into the engine's
requests (:class:`~fear_assets.lm.requests.Request`) and runs them with
:func:`fear_assets.lm.runner.run`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import pandas as pd

SIDES = ("agent", "partner")
FORMS = ("name", "role", "quotation", "first_person")
#: Forms the foreign judge scores (4.8): role phrases would be ambiguous for it.
JUDGE_FORMS = ("name", "quotation")


@dataclass
class DocumentRequest:
    """One document's readouts as data: the bookkeeping (branches, labels, spans) on top of
    the engine's requests; its fields, as data, name its resumable chunk (do not rename them)."""

    key: str
    reader: str
    trial_ids: list[str]
    branches: dict[str, str]  # branch -> full rendered text (each ends where the answer starts)
    continuations: dict[str, dict[str, str]] = field(default_factory=dict)  # branch -> label -> text
    choices: dict[str, list[str]] = field(default_factory=dict)  # branch -> choice letters
    generate: str | None = None  # branch to generate on
    features: bool = False
    question_branch: str = "report"
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # label -> char span in the text
    question_span: tuple[int, int] | None = None  # char span of the open question in the report text


def _branch_suffix(suffix: str, report_prompt: str, prompt: str) -> str:
    if suffix.count(report_prompt) != 1:
        raise ValueError("the report prompt must occur exactly once in the suffix")
    return suffix.replace(report_prompt, prompt)


ALL_READOUTS = frozenset({"report", "recall", "forced_choice", "generate"})


def build_requests(table: pd.DataFrame, templates: Mapping, document_text: Callable[[Mapping], str],
                   readouts: Mapping[str, Sequence[str]] | None = None) -> list[DocumentRequest]:
    """Document requests of one partition (both agent documents and their baselines).

    ``readouts`` (block -> readouts) restricts what a block reads (a reduced design's
    ``branches``); a block not named reads every branch, as a registered family does."""
    readouts = readouts or {}
    prompts = templates["prompts"]
    report_prompt = prompts["report"]
    requests: dict[str, DocumentRequest] = {}
    baselines: dict[str, DocumentRequest] = {}
    rows = table.to_dict("records")
    for row in rows:
        if row["block_kind"] != "baseline":
            continue
        text = document_text(row)
        head = text[: len(text) - len(row["suffix_text"])]
        baselines[row["unit_id"]] = DocumentRequest(
            key=row["trial_id"], reader=row["reader"], trial_ids=[row["trial_id"]],
            branches={"report": text, "recall": head + _branch_suffix(row["suffix_text"], report_prompt, prompts["recall"])},
            continuations={"report": {}, "recall": {}},
        )
    for row in rows:
        if row["block_kind"] == "baseline":
            continue
        text = document_text(row)
        head = text[: len(text) - len(row["suffix_text"])]
        conts = json.loads(row["continuations"]) if row["continuations"] else {}
        forms = JUDGE_FORMS if row["reader"] == "judge" else FORMS
        req = DocumentRequest(key=row["trial_id"], reader=row["reader"], trial_ids=[row["trial_id"]],
                              branches={"report": text})
        if row["version"] == "other" or row["block_kind"] == "no_agent":
            # Probe-only documents (the other content version; no agent sentence): the
            # residual features at the open question are all that is read from them.
            req.features = True
            q_start = text.rindex(report_prompt)
            req.question_span = (q_start, q_start + len(report_prompt))
            requests[row["trial_id"]] = req
            continue
        wanted = set(readouts.get(row["block"], ALL_READOUTS))
        if row["prompt"] == "report":
            if "report" in wanted:
                req.continuations["report"] = {f"{side}_{form}": conts[side][form] for side in SIDES
                                               if side in conts for form in forms if form in conts[side]}
            if row["block_kind"] == "agent":
                if "recall" in wanted:
                    req.branches["recall"] = head + _branch_suffix(row["suffix_text"], report_prompt, prompts["recall"])
                    req.continuations["recall"] = {f"{s}_recall": conts[s]["quotation"] for s in SIDES}
                if "forced_choice" in wanted:
                    req.branches["forced_choice"] = head + _branch_suffix(row["suffix_text"], report_prompt,
                                                                          row["forced_choice_prompt"])
                    req.choices["forced_choice"] = ["A", "B"]
                if "generate" in wanted:
                    req.generate = "report"
            if wanted == ALL_READOUTS:
                req.features = True
                q_start = text.rindex(report_prompt)
                req.question_span = (q_start, q_start + len(report_prompt))
        elif row["prompt"] in ("binding_check", "protective_choice"):
            req.choices["report"] = ["A", "B", "C"] if row["prompt"] == "binding_check" else ["A", "B"]
            if "generate" in wanted:
                req.generate = "report"
        if conts:
            for side in SIDES:
                sentence = conts[side]["quotation"]
                at = row["prefix_text"].rfind(sentence)
                if at >= 0:
                    req.spans[side] = (at, at + len(sentence))
        requests[row["trial_id"]] = req
        base = baselines.get(row["baseline_unit_id"])
        if base is not None and row["prompt"] == "report" and conts:
            base.trial_ids.append(row["trial_id"])
            base.continuations["report"].update({v: v for v in req.continuations.get("report", {}).values()})
            base.continuations["recall"].update({v: v for v in req.continuations.get("recall", {}).values()})
    # A baseline whose dependent trials read no recall does not run that branch.
    for base in baselines.values():
        if not base.continuations["recall"]:
            del base.branches["recall"], base.continuations["recall"]
    return [*requests.values(), *baselines.values()]
