"""A partition's document requests executed by the engine (protocol 4.5, 4.8, Appendix B).

Each :class:`~fear_assets.design.requests.DocumentRequest` becomes one list of the engine's
:class:`~fear_assets.lm.requests.Request` against the document's shared prefix (its
branches' longest common head); :func:`score_requests` runs every list through the engine's
one entry point, :func:`fear_assets.lm.runner.run` (one prefix cache per document, packed
scoring passes, answers decoded in batches across documents), with the attention and
residual captures active in the document's first forward, and returns one long row per
(document, branch, continuation label), one readout per document and the feature rows.
The exclusion rule (4.8: only a document that exceeds the context window) is decided here.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.design.requests import DocumentRequest
from fear_assets.lm.engine import TeacherForcedEngine, encode_pair
from fear_assets.lm.readouts import AttentionCapture, ResidualCapture, later_layers
from fear_assets.lm.requests import Request
from fear_assets.lm.runner import run


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

    def report_encoding(req: DocumentRequest):  # with offsets (question and sentence spans)
        return tokenizer(req.branches["report"], add_special_tokens=False, return_offsets_mapping=True)

    def prefix_key(req: DocumentRequest) -> bytes:
        branch_ids, shared, _ = _prepare(req, report_encoding(req), encode)
        # Big-endian: the bytes sort as the token ids do (ids are non-negative).
        return np.asarray(branch_ids["report"][:shared], dtype=">i4").tobytes()

    # Documents run in the order of their shared prefixes' token ids (equal heads sort
    # together), so that each prefix keeps the longest head of the one before it (the engine's
    # prefix reuse); the outputs keep the input order. Only the keys are held (a registered
    # partition's token lists with offsets would not fit in memory); documents are encoded again
    # as they run (the batches below are a generator).
    order = sorted(range(len(requests)), key=[prefix_key(req) for req in requests].__getitem__)
    long_by: list[list[dict]] = [[] for _ in requests]
    readout_by: list[dict | None] = [None] * len(requests)
    feature_by: dict[int, np.ndarray] = {}
    ran: list[_Running] = []  # per engine batch, the document it reads
    started = time.perf_counter()

    def batches() -> Iterator[tuple[list[int], list[Request]]]:
        for done, k in enumerate(order, start=1):
            req = requests[k]
            report_enc = report_encoding(req)
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
            readout_by[k] = readout
            if readout["excluded_context"]:
                readout["exclusion_reason"] = (f"the document needs {document} tokens; the context window is "
                                               f"{config.context_window}")
                continue
            if over:
                readout["exclusion_reason"] = ("not excluded; an answer cannot fit after the document in branch(es) "
                                               + ", ".join(f"{b} ({answer_room[b]} tokens left)" for b in over))
            # The greedy answer stops where the window ends (a cut answer is flagged truncated).
            gen_limit = min(config.max_new_tokens, max(answer_room[req.generate], 0)) if req.generate else 0
            doc_requests, where = _document_requests(
                req, branch_ids, shared, cont_ids, {b: _choice_ids(tokenizer, c) for b, c in req.choices.items()},
                gen_limit, eos_ids)
            ran.append(_Running(k, done, readout, list(branch_ids), where, shared, question,
                                report_enc["offset_mapping"], gen_limit,
                                bool(req.spans and question), bool(req.features and question)))
            yield branch_ids["report"][:shared], doc_requests

    def hook(i: int):
        doc = ran[i]
        if not (doc.attend or doc.feature):
            return None

        def active(view, attend=doc.attend, feature=doc.feature, position=doc.question[0] if doc.question else 0):
            stack = contextlib.ExitStack()
            if attend:
                stack.enter_context(capture.active(view))
            if feature:
                stack.enter_context(residual.active(position))
            return stack

        return active

    def after(i: int, responses) -> None:
        doc = ran[i]
        k, req, readout = doc.index, requests[doc.index], doc.readout
        by_branch: dict[str, list[float]] = {}
        for (b, what, label), resp in zip(doc.where, responses):
            if what == "score":
                s = resp.score
                long_by[k].append({"request": req.key, "branch": b, "label": label, "mean_logprob": s.mean_logprob,
                                  "sum_logprob": s.sum_logprob, "n_tokens": s.n_tokens, "greedy": s.greedy})
            elif what == "choice" and resp.logprobs:
                by_branch[b] = list(resp.logprobs)
        for b in doc.branches:  # the column order of the per-branch loop this replaced
            if b in by_branch:
                readout[f"{b}_choice_logprobs"] = json.dumps(by_branch[b])
            if req.generate == b:  # filled once the queue is decoded
                readout["generated_text"], readout["generation_truncated"] = None, None
                if doc.gen_limit <= 0:  # no room at all for an answer: nothing is generated, a truncation too
                    readout["generated_text"], readout["generation_truncated"] = "", True
        if doc.feature:
            # The residual stream at the first token of the open question.
            feature_by[k] = residual.mean().cpu().numpy().astype(np.float32)
            readout["feature_row"] = -1  # its row in the input order, set below
        if doc.attend:
            labels = list(req.spans)
            masses = capture.mass(doc.question, [_token_span(doc.offsets, *req.spans[lab]) for lab in labels],
                                  doc.shared)
            for label, mass in zip(labels, masses):
                readout[f"attention_{label}"] = mass
        if progress:
            progress(doc.done, len(requests), time.perf_counter() - started)

    for doc, responses in zip(ran, run(engine, batches(), hook=hook, after=after)):
        for (_, what, _), resp in zip(doc.where, responses):
            if what == "generate":
                doc.readout["generated_text"] = tokenizer.decode(list(resp.generated_ids), skip_special_tokens=True)
                doc.readout["generation_truncated"] = resp.truncated
    for k in range(len(requests)):  # the input order: rows, readouts, feature rows
        long_rows += long_by[k]
        if k in feature_by:
            readout_by[k]["feature_row"] = len(features)
            features.append(feature_by[k])
        readouts.append(readout_by[k])
    dim = features[0].shape[0] if features else 0
    return pd.DataFrame(long_rows), pd.DataFrame(readouts), (np.stack(features) if features else np.zeros((0, dim), np.float32))


@dataclass
class _Running:
    """What the readout of a document that runs needs once its engine batch has run."""

    index: int  # in the input order
    done: int  # its place in the run order (progress)
    readout: dict
    branches: list[str]
    where: list[tuple[str, str, str]]
    shared: int
    question: list[int] | None
    offsets: Sequence[tuple[int, int]]
    gen_limit: int
    attend: bool
    feature: bool


__all__ = ["ScoringSettings", "score_requests"]
