"""Choice questions without a document (protocol 4.2 binding check, 4.3 zero preference,
4.5 blinded scorer): the log-probability of each answer token right after a question.

Questions that share a chat prefix (the system prompt of one rotation) are one request
list against that prefix (:func:`choice_batch`): each question's body is a ``next_token``
request reading the answer tokens, run by :func:`fear_assets.lm.runner.run`. The engine
prefills the prefix once and packs the bodies into a few forwards, so hundreds of
questions cost a few passes.
"""

from __future__ import annotations

from typing import Sequence

from fear_assets.lm.requests import Request
from fear_assets.lm.runner import Batch


def answer_token_ids(tokenizer, answers: Sequence[str]) -> list[int]:
    """The first token of each answer as the model would write it to open its reply."""
    ids = []
    for answer in answers:
        encoded = tokenizer.encode(answer, add_special_tokens=False)
        if not encoded:
            raise ValueError(f"the answer {answer!r} encodes to no token; register a non-empty answer")
        ids.append(encoded[0])
    if len(set(ids)) != len(ids):
        raise ValueError(f"answers {list(answers)} share their first token; register answers that differ at once")
    return ids


def choice_batch(tokenizer, prefix: str, bodies: Sequence[str], answers: Sequence[str]) -> Batch:
    """The questions after one shared ``prefix`` as one request list for :func:`~fear_assets.lm.runner.run`:
    per body, a ``next_token`` request reading each answer's first token after ``prefix + body``.

    ``body`` is everything after the shared ``prefix`` up to where the reply starts (the
    question and the chat template's assistant header). The engine prefills the prefix once
    and packs the bodies into rows from its cache; response ``i``'s ``logprobs`` are body
    ``i``'s answers' log-probabilities."""
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    answer_ids = answer_token_ids(tokenizer, answers)
    requests = []
    for body in bodies:
        ids = tokenizer.encode(prefix + body, add_special_tokens=False)
        if ids[: len(prefix_ids)] != prefix_ids or len(ids) == len(prefix_ids):
            raise ValueError("the question merged with the shared chat prefix; check the chat template")
        requests.append(Request.next_token(ids[len(prefix_ids):], answer_ids))
    return prefix_ids, requests
