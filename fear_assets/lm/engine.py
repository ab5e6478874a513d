"""Teacher-forced scoring with one prefill per document (protocol 4.5).

Importable with torch and transformers alone (no Dagster), so the same engine runs on a
CPU here and on a GPU host.

For every document the shared prefix is run ONCE; each branch (report, recall, forced
choice, ...) then extends a copy of that KV cache with its prompt, and all continuations
of the branch are scored from the branch's cache in ONE batched forward with explicit
positions. lm-evaluation-harness instead re-encodes the whole context for every
continuation (``_loglikelihood_tokens``); the scores are the same (tested to 1e-4
nats/token against a naive full forward per continuation), the work is not.

Padding is on the right and every continuation row sees the full cached prefix through a
2D attention mask, so the model's own mask builder handles sliding-window layers and
grouped-query attention exactly as in generation.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


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
class Branch:
    """One branch of a document: prompt tokens appended to the shared prefix, then scored."""

    name: str
    prompt_ids: Sequence[int]
    continuations: Sequence[Sequence[int]] = ()
    choice_ids: Sequence[int] = ()  # token ids whose next-token probabilities are read (forced choice)
    generate_tokens: int = 0  # greedy generation length (0: none)
    eos_ids: Sequence[int] = ()


@dataclass
class BranchResult:
    scores: list[ContinuationScore] = field(default_factory=list)
    choice_logprobs: list[float] = field(default_factory=list)
    generated_ids: list[int] = field(default_factory=list)
    truncated: bool = False
    residual: "torch.Tensor | None" = None  # mean residual stream at the requested position
    captured: bool = False  # an attention capture ran during this branch's extension


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Split (context, continuation) at the token boundary as lm-evaluation-harness does:
    the continuation's tokens are those of ``context + continuation`` after the context's
    tokens, and trailing spaces of the context move to the continuation. Unlike lm-eval,
    a trailing newline stays in the context: in a chat document it ends the assistant
    header, and scoring it would add a near-certain token to every report's mean."""
    n_spaces = len(context) - len(context.rstrip(" "))
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids):]


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


class TeacherForcedEngine:
    """Scores requests on one loaded causal LM (batch of continuations per branch)."""

    def __init__(self, model):
        self.model = model.eval()
        self.device = _device(model)

    # -- primitives ---------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], keep_logits: int = 1):
        """Run ``ids`` once; returns (cache, logits of the last ``keep_logits`` positions, outputs)."""
        x = torch.tensor([list(ids)], device=self.device)
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep_logits)
        return out.cache, out.logits[0], out

    @torch.inference_mode()
    def extend(self, cache, ids: Sequence[int], keep_logits: int = 1):
        """Append ``ids`` to a batch-1 cache (in place); returns (logits, outputs)."""
        start = cache.get_seq_length()
        x = torch.tensor([list(ids)], device=self.device)
        positions = torch.arange(start, start + len(ids), device=self.device)
        out = self.model(input_ids=x, cache=cache, use_cache=True, position_ids=positions[None],
                         cache_position=positions, logits_to_keep=keep_logits)
        return out.logits[0], out

    @torch.inference_mode()
    def continuations_from_cache(self, cache, last_logits: torch.Tensor,
                                 continuations: Sequence[Sequence[int]]) -> list[ContinuationScore]:
        """Score continuations given the cache of their context and the context's last logits.

        The first token of each continuation is read from ``last_logits``; the rest come from
        one batched forward over ``continuation[:-1]`` rows, right-padded, positions
        continuing the cache. The cache is consumed (expanded to the batch)."""
        first = _log_softmax(last_logits)
        first_arg = int(first.argmax())
        n_ctx = cache.get_seq_length()
        rows = [list(c) for c in continuations]
        width = max(len(r) for r in rows) - 1
        rest = None
        if width > 0:
            b = len(rows)
            inputs = torch.zeros((b, width), dtype=torch.long, device=self.device)
            mask = torch.zeros((b, n_ctx + width), dtype=torch.long, device=self.device)
            mask[:, :n_ctx] = 1
            for i, r in enumerate(rows):
                inputs[i, : len(r) - 1] = torch.tensor(r[:-1], device=self.device)
                mask[i, n_ctx: n_ctx + len(r) - 1] = 1
            positions = torch.arange(n_ctx, n_ctx + width, device=self.device)
            cache.batch_repeat_interleave(b)
            out = self.model(input_ids=inputs, attention_mask=mask, cache=cache, use_cache=True,
                             position_ids=positions[None].expand(b, -1), cache_position=positions)
            rest = _log_softmax(out.logits)
        scores = []
        for i, r in enumerate(rows):
            lps = [float(first[r[0]])]
            greedy = first_arg == r[0]
            if len(r) > 1:
                targets = torch.tensor(r[1:], device=self.device)
                row = rest[i, : len(r) - 1]
                lps += row.gather(-1, targets[:, None])[:, 0].tolist()
                greedy = greedy and bool((row.argmax(-1) == targets).all())
            scores.append(ContinuationScore(tuple(lps), greedy))
        return scores

    @torch.inference_mode()
    def greedy(self, cache, last_logits: torch.Tensor, max_new_tokens: int,
               eos_ids: Sequence[int]) -> tuple[list[int], bool]:
        """Greedy decoding from a batch-1 cache; returns (tokens, truncated by the limit)."""
        out_ids: list[int] = []
        logits = last_logits
        for _ in range(max_new_tokens):
            token = int(logits.argmax())
            if token in set(eos_ids):
                return out_ids, False
            out_ids.append(token)
            logits, _ = self.extend(cache, [token])
            logits = logits[-1]
        return out_ids, True

    # -- a whole document ---------------------------------------------------------------
    @torch.inference_mode()
    def run_document(self, prefix_ids: Sequence[int], branches: Sequence[Branch],
                     capture_branch: dict | None = None,
                     residual: tuple[str, object, int] | None = None) -> dict[str, BranchResult]:
        """One prefill of ``prefix_ids``, then every branch from a copy of its cache.

        ``capture_branch`` maps a branch name to an object with ``active(cache)`` (e.g. an
        attention capture) that is active while that branch's prompt is appended;
        ``residual`` = (branch, ResidualCapture, position in that branch's prompt) reads the
        residual stream there through forward hooks."""
        capture_branch = capture_branch or {}
        cache, _, _ = self.prefill(prefix_ids, keep_logits=1)
        results: dict[str, BranchResult] = {}
        for i, branch in enumerate(branches):
            own = cache if i == len(branches) - 1 else copy.deepcopy(cache)
            result = BranchResult()
            with contextlib.ExitStack() as stack:
                if branch.name in capture_branch:
                    stack.enter_context(capture_branch[branch.name].active(own))
                    result.captured = True
                if residual is not None and residual[0] == branch.name:
                    stack.enter_context(residual[1].active(residual[2]))
                logits, _ = self.extend(own, branch.prompt_ids)
            if residual is not None and residual[0] == branch.name:
                result.residual = residual[1].mean()
            last = logits[-1]
            if branch.choice_ids:
                lp = _log_softmax(last)
                result.choice_logprobs = [float(lp[t]) for t in branch.choice_ids]
            gen_cache = copy.deepcopy(own) if branch.continuations and branch.generate_tokens else own
            if branch.continuations:
                result.scores = self.continuations_from_cache(own, last, branch.continuations)
            if branch.generate_tokens:
                result.generated_ids, result.truncated = self.greedy(gen_cache, last, branch.generate_tokens,
                                                                     branch.eos_ids)
            results[branch.name] = result
        return results

    @torch.inference_mode()
    def next_token_logprobs(self, cache, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Log-probabilities of the next token after each row appended to ``cache`` (one
        batched forward, right-padded; the head runs only at each row's last position, which
        is what choice questions read). The cache is consumed (expanded to the batch)."""
        n_ctx = cache.get_seq_length()
        b, width = len(rows), max(len(r) for r in rows)
        inputs = torch.zeros((b, width), dtype=torch.long, device=self.device)
        mask = torch.zeros((b, n_ctx + width), dtype=torch.long, device=self.device)
        mask[:, :n_ctx] = 1
        for i, r in enumerate(rows):
            inputs[i, : len(r)] = torch.tensor(list(r), device=self.device)
            mask[i, n_ctx: n_ctx + len(r)] = 1
        positions = torch.arange(n_ctx, n_ctx + width, device=self.device)
        cache.batch_repeat_interleave(b)
        out = self.model.get_decoder()(input_ids=inputs, attention_mask=mask, cache=cache, use_cache=True,
                                       position_ids=positions[None].expand(b, -1), cache_position=positions)
        last = out.last_hidden_state[torch.arange(b, device=self.device),
                                     torch.tensor([len(r) - 1 for r in rows], device=self.device)]
        logits = self.model.get_output_embeddings()(last).float()
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:  # Gemma-2 caps its final logits in the causal-LM head; so must we
            logits = torch.tanh(logits / cap) * cap
        return torch.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def score_many(self, context_ids: Sequence[int], continuations: Sequence[Sequence[int]],
                   batch_size: int = 64) -> list[ContinuationScore]:
        """Many continuations of one context: one prefill, then batches from copies of its cache."""
        cache, logits, _ = self.prefill(context_ids)
        out: list[ContinuationScore] = []
        for i in range(0, len(continuations), batch_size):
            chunk = continuations[i: i + batch_size]
            last_chunk = i + batch_size >= len(continuations)
            out += self.continuations_from_cache(cache if last_chunk else copy.deepcopy(cache), logits[-1], chunk)
        return out

    @torch.inference_mode()
    def score(self, context_ids: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[ContinuationScore]:
        """Score continuations of one context: one prefill, one batched pass."""
        return self.score_many(context_ids, continuations, batch_size=max(1, len(continuations)))


@torch.inference_mode()
def naive_scores(model, context_ids: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[ContinuationScore]:
    """Reference: one full forward per continuation, no cache (what the engine must equal)."""
    device = _device(model)
    out = []
    for cont in continuations:
        ids = torch.tensor([list(context_ids) + list(cont)], device=device)
        logits = _log_softmax(model(input_ids=ids, use_cache=False).logits[0])
        n = len(context_ids)
        targets = torch.tensor(list(cont), device=device)
        rows = logits[n - 1: n - 1 + len(cont)]
        lps = rows.gather(-1, targets[:, None])[:, 0].tolist()
        out.append(ContinuationScore(tuple(lps), bool((rows.argmax(-1) == targets).all())))
    return out
