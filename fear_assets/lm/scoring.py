"""Document requests as data, executed as engine requests (protocol 4.5, Appendix B).

:func:`build_requests` turns a partition of the trial table into document requests: for
each document its branch texts (report, recall, forced choice, or the block's own prompt),
the continuations to score on each branch, the choices to read, whether to generate, and
the sentence spans whose attention mass is read. Distractor-only baselines score the union
of their dependent trials' continuations. :func:`score_requests` turns each document into
a list of :class:`~fear_assets.lm.requests.Request` against its shared prefix (one prefill,
packed scoring passes, answers decoded in batches across documents) and returns one row
per trial; it never decides what to score.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.lm.engine import TeacherForcedEngine, encode_pair
from fear_assets.lm.requests import Request
from fear_assets.lm.readouts import AttentionCapture, ResidualCapture, later_layers

SIDES = ("agent", "partner")
FORMS = ("name", "role", "quotation", "first_person")
#: Forms the foreign judge scores (4.8): role phrases would be ambiguous for it.
JUDGE_FORMS = ("name", "quotation")


@dataclass
class DocumentRequest:
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


def _lcp(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n


def _choice_ids(tokenizer, letters: Iterable[str]) -> list[int]:
    ids = []
    for letter in letters:
        encoded = tokenizer.encode(letter, add_special_tokens=False)
        ids.append(encoded[0])
    return ids


def _token_span(offsets: Sequence[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    idx = [i for i, (s, e) in enumerate(offsets) if e > a and s < b and e > s]
    return (idx[0], idx[-1] + 1) if idx else (0, 0)


def _prepare(req: DocumentRequest, report_enc, encode) -> tuple[dict[str, list[int]], int, list[int] | None]:
    """A document's branch token ids, the length of its shared prefix, and the open
    question's positions in the report branch's extension (None without a question span)."""
    branch_ids = {b: (report_enc["input_ids"] if b == "report" else encode(t)) for b, t in req.branches.items()}
    shared = _lcp(list(branch_ids.values()))
    # Keep at least one token in every branch (the branch's last logits come from it).
    shared = min(shared, min(len(v) for v in branch_ids.values()) - 1)
    question = None
    if req.question_span is not None:
        q_a, q_b = _token_span(report_enc["offset_mapping"], *req.question_span)
        # The open question's tokens must lie in the report branch's own extension.
        shared = min(shared, q_a)
        question = list(range(q_a - shared, q_b - shared))
    return branch_ids, shared, question


@dataclass
class ScoringSettings:
    context_window: int
    max_new_tokens: int
    layers_fraction_from: float


def _document_requests(req: DocumentRequest, branch_ids: Mapping[str, list[int]], shared: int,
                       cont_ids: Mapping[str, Mapping[str, list[int]]], choice_ids: Mapping[str, list[int]],
                       max_new_tokens: int, eos_ids: Sequence[int]) -> tuple[list[Request], list[tuple[str, str, str]]]:
    """A document's readouts as requests against its shared prefix: the report branch first
    (it opens the packed row, where the captures read it), then the others in order. Every
    branch gets a prompt read (its choices, or none) so that its prompt runs."""
    requests, where = [], []
    for b in sorted(branch_ids, key=lambda name: name != "report"):
        prompt = branch_ids[b][shared:]
        requests.append(Request.next_token(prompt, choice_ids.get(b, [])))
        where.append((b, "choice", ""))
        for label, ids in cont_ids.get(b, {}).items():
            requests.append(Request.loglikelihood(prompt, ids))
            where.append((b, "score", label))
        if req.generate == b and max_new_tokens > 0:
            requests.append(Request.generate(prompt, max_new_tokens, eos_ids))
            where.append((b, "generate", ""))
    return requests, where


def score_requests(engine: TeacherForcedEngine, tokenizer, requests: Sequence[DocumentRequest],
                   config: ScoringSettings, progress: Callable[[int, int, float], None] | None = None,
                   eos_ids: Sequence[int] = ()) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Run every request. Returns (document scores long table, per-document readouts, features).

    The long table has one row per (request, branch, continuation label); readouts one row
    per request (choice log-probs, generated text, attention mass, exclusion, feature row).
    Each document is one prefix (a prefill, or the previous document's longest common head
    extended: documents run in the order of their prefixes' tokens) and packed scoring
    passes; its greedy answer waits in a queue and is decoded with
    ``engine.generation_batch`` other documents at once. Rows, readouts and feature rows
    are returned in the input order.
    """
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    n_layers = engine.model.config.num_hidden_layers
    layers = later_layers(n_layers, config.layers_fraction_from)
    capture = AttentionCapture(engine.model, layers)
    residual = ResidualCapture(engine.model, layers)
    long_rows, readouts, features = [], [], []
    pending: list[tuple[dict, object]] = []  # (readout, generation state)

    def flush():
        for (readout, _), (ids, truncated) in zip(pending, engine.generate([s for _, s in pending])):
            readout["generated_text"] = tokenizer.decode(ids, skip_special_tokens=True)
            readout["generation_truncated"] = truncated
        pending.clear()

    def report_encoding(req: DocumentRequest):  # with offsets (question and sentence spans)
        return tokenizer(req.branches["report"], add_special_tokens=False, return_offsets_mapping=True)

    def prefix_key(req: DocumentRequest) -> bytes:
        branch_ids, shared, _ = _prepare(req, report_encoding(req), encode)
        # Big-endian: the bytes sort as the token ids do (ids are non-negative).
        return np.asarray(branch_ids["report"][:shared], dtype=">i4").tobytes()

    # Documents run in the order of their shared prefixes' token ids (equal heads sort
    # together), so that each prefix keeps the longest head of the one before it (the engine's
    # prefix reuse); the outputs keep the input order. Only the keys are held (a registered
    # partition's token lists with offsets would not fit in memory); documents are encoded again.
    order = sorted(range(len(requests)), key=[prefix_key(req) for req in requests].__getitem__)
    long_by: list[list[dict]] = [[] for _ in requests]
    readout_by: list[dict | None] = [None] * len(requests)
    feature_by: dict[int, np.ndarray] = {}
    started = time.perf_counter()
    for done, k in enumerate(order, start=1):
        req = requests[k]
        report_enc = report_encoding(req)
        offsets = report_enc["offset_mapping"]
        branch_ids, shared, question = _prepare(req, report_enc, encode)
        cont_ids = {b: {label: encode_pair(encode, req.branches[b][-256:], text)[1] for label, text in c.items()}
                    for b, c in req.continuations.items()}
        # 4.8: "A trial is excluded only if the document exceeds the context window after
        # tokenisation": the document (each branch's prompt) alone decides the exclusion. An
        # answer that cannot fit after a document that does is recorded, not excluded:
        # ``answer_exceeds_context`` (counted in the exclusion report). Reports are still scored
        # (teacher forcing past the window; the flag says so), and the greedy answer is cut where
        # the window ends, which marks it truncated by the length limit (excluded by that rule).
        document = max(len(ids) for ids in branch_ids.values())
        answer_room = {b: config.context_window - len(branch_ids[b]) for b in branch_ids}
        answer_needs = {b: max((len(x) for x in cont_ids.get(b, {}).values()), default=0) for b in branch_ids}
        generate = {b: (config.max_new_tokens if req.generate == b else 0) for b in branch_ids}
        over = [b for b in branch_ids if max(answer_needs[b], generate[b]) > answer_room[b]]
        readout = {"request": req.key, "reader": req.reader, "n_tokens": len(branch_ids["report"]),
                   "excluded_context": document > config.context_window, "exclusion_reason": "",
                   "answer_exceeds_context": bool(over), "trial_ids": json.dumps(req.trial_ids)}
        if readout["excluded_context"]:
            readout["exclusion_reason"] = (f"the document needs {document} tokens; the context window is "
                                           f"{config.context_window}")
            readout_by[k] = readout
            continue
        if over:
            readout["exclusion_reason"] = ("not excluded; an answer cannot fit after the document in branch(es) "
                                           + ", ".join(f"{b} ({answer_room[b]} tokens left)" for b in over))
        # The greedy answer stops where the window ends (a cut answer is flagged truncated).
        gen_limit = min(config.max_new_tokens, max(answer_room[req.generate], 0)) if req.generate else 0
        doc_requests, where = _document_requests(
            req, branch_ids, shared, cont_ids, {b: _choice_ids(tokenizer, c) for b, c in req.choices.items()},
            gen_limit, eos_ids)
        attend = bool(req.spans and question)
        feature = bool(req.features and question)

        def hook(view, attend=attend, feature=feature, position=question[0] if question else 0):
            stack = contextlib.ExitStack()
            if attend:
                stack.enter_context(capture.active(view))
            if feature:
                stack.enter_context(residual.active(position))
            return stack

        responses, states = engine.start(branch_ids["report"][:shared], doc_requests,
                                         hook if (attend or feature) else None)
        by_branch: dict[str, list[float]] = {}
        for i, ((b, what, label), resp) in enumerate(zip(where, responses)):
            if what == "score":
                s = resp.score
                long_by[k].append({"request": req.key, "branch": b, "label": label, "mean_logprob": s.mean_logprob,
                                  "sum_logprob": s.sum_logprob, "n_tokens": s.n_tokens, "greedy": s.greedy})
            elif what == "choice" and resp.logprobs:
                by_branch[b] = list(resp.logprobs)
            elif what == "generate":
                pending.append((readout, states[i]))
        for b in branch_ids:  # the column order of the per-branch loop this replaced
            if b in by_branch:
                readout[f"{b}_choice_logprobs"] = json.dumps(by_branch[b])
            if req.generate == b:  # filled when the queue is decoded
                readout["generated_text"], readout["generation_truncated"] = None, None
                if gen_limit <= 0:  # no room at all for an answer: nothing is generated, a truncation too
                    readout["generated_text"], readout["generation_truncated"] = "", True
        if feature:
            # The residual stream at the first token of the open question.
            feature_by[k] = residual.mean().cpu().numpy().astype(np.float32)
            readout["feature_row"] = -1  # its row in the input order, set below
        if attend:
            labels = list(req.spans)
            masses = capture.mass(question, [_token_span(offsets, *req.spans[l]) for l in labels], shared)
            for label, mass in zip(labels, masses):
                readout[f"attention_{label}"] = mass
        readout_by[k] = readout
        if len(pending) >= max(1, engine.generation_batch):
            flush()
        if progress:
            progress(done, len(requests), time.perf_counter() - started)
    flush()
    for k in range(len(requests)):  # the input order: rows, readouts, feature rows
        long_rows += long_by[k]
        if k in feature_by:
            readout_by[k]["feature_row"] = len(features)
            features.append(feature_by[k])
        readouts.append(readout_by[k])
    dim = features[0].shape[0] if features else 0
    return pd.DataFrame(long_rows), pd.DataFrame(readouts), (np.stack(features) if features else np.zeros((0, dim), np.float32))
