"""One request type for every readout (protocol 4.5, Appendix B; lm-evaluation-harness's
``Instance`` in spirit).

Every readout of the study is a request against a shared prefix (a document's common
head, or the system prompt of a rotation for the document-free questions):

- ``loglikelihood``: the log-probability of ``continuation`` after ``prefix + prompt``
  (report and recall continuations, sentence surprisal);
- ``next_token``: the next-token log-probabilities of ``choice_ids`` after ``prefix + prompt``
  (forced choice, binding check, protective choice, the pilot's document-free questions);
- ``generate``: greedy tokens after ``prefix + prompt`` until an end token or
  ``max_new_tokens`` (the open answer).

Requests are data built before any model runs (what a document reads is decided by the design
stage); :func:`fear_assets.lm.runner.run`, the engine's one entry point, executes lists of
them and never decides what to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

LOGLIKELIHOOD, NEXT_TOKEN, GENERATE = "loglikelihood", "next_token", "generate"
KINDS = (LOGLIKELIHOOD, NEXT_TOKEN, GENERATE)


@dataclass(frozen=True)
class Request:
    """One readout after ``prefix + prompt`` (``prompt`` = token ids after the shared prefix)."""

    kind: str
    prompt: tuple[int, ...] = ()
    continuation: tuple[int, ...] = ()
    choice_ids: tuple[int, ...] | None = ()  # None: the whole next-token distribution
    max_new_tokens: int = 0
    eos_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"request kind {self.kind!r} is not one of {KINDS}")
        if self.kind == LOGLIKELIHOOD and not self.continuation:
            raise ValueError("a loglikelihood request needs a non-empty continuation")
        if self.kind == GENERATE and self.max_new_tokens < 1:
            raise ValueError("a generate request needs max_new_tokens >= 1")

    @classmethod
    def loglikelihood(cls, prompt: Sequence[int], continuation: Sequence[int]) -> "Request":
        return cls(LOGLIKELIHOOD, tuple(prompt), tuple(continuation))

    @classmethod
    def next_token(cls, prompt: Sequence[int], choice_ids: Sequence[int] | None) -> "Request":
        return cls(NEXT_TOKEN, tuple(prompt), choice_ids=None if choice_ids is None else tuple(choice_ids))

    @classmethod
    def generate(cls, prompt: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = ()) -> "Request":
        return cls(GENERATE, tuple(prompt), max_new_tokens=int(max_new_tokens), eos_ids=tuple(eos_ids))


@dataclass(frozen=True)
class ContinuationScore:
    """Log-probabilities of one continuation given its context."""

    token_logprobs: tuple[float, ...]
    greedy: bool  # every continuation token is the argmax (lm-eval's is_greedy)

    @property
    def n_tokens(self) -> int:
        return len(self.token_logprobs)

    @property
    def sum_logprob(self) -> float:
        return float(sum(self.token_logprobs))

    @property
    def mean_logprob(self) -> float:
        return self.sum_logprob / max(1, self.n_tokens)


@dataclass
class Response:
    """What one request read: exactly one field is set, by the request's kind."""

    score: ContinuationScore | None = None  # loglikelihood
    logprobs: tuple[float, ...] = ()  # next_token with choice ids
    distribution: "torch.Tensor | None" = None  # next_token with choice_ids=None
    generated_ids: tuple[int, ...] = ()  # generate
    truncated: bool = False  # generate: stopped by max_new_tokens, not by an end token
