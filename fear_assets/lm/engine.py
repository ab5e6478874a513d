"""Teacher-forced scoring and greedy generation with one prefill per prefix (protocol 4.5).

Importable with torch and transformers alone (no Dagster), so the same engine runs on a
CPU here and on a GPU host.

The engine executes lists of :class:`~fear_assets.lm.requests.Request` against a shared
prefix; every caller reaches it through the one entry point :func:`fear_assets.lm.runner.run`
(the methods here are its primitives). The prefix is run ONCE. Every prompt (branch) and every continuation of the list
is then packed into ONE row after the cached prefix: each segment gets its own positions
(a continuation's positions follow its prompt's) and a block-diagonal 4D mask lets it see
the prefix, its own prompt and itself, causally. The prefix cache is neither copied per
continuation nor repeated per row; sliding-window layers get the window through the same
mask (computed from positions), so GQA, sliding windows and Gemma-2's alternating layers
with soft-capping are handled alike. lm-evaluation-harness instead re-encodes the whole
context for every continuation (``_loglikelihood_tokens``); the scores are the same (tested
to 1e-4 nats/token against a naive full forward per continuation), the work is not.

Greedy generation is batched across prefixes (documents): each document's cache after its
prompt is left-padded into one batch and decoded one token per step for all rows, with
explicit positions and masks, so the weights are read once per step for the whole batch.
Its tokens are tested identical to one-document-at-a-time greedy decoding.

Prefix reuse across documents (``reuse_prefix``): documents of a design share long heads
(the system prompt and the opening of the user turn; at the deepest depth the in-context
binding documents share all but their question). The engine keeps the last prefix's cache;
the next prefix keeps its longest common head with it (a view of those keys, not a copy) and
runs only the rest, from its own positions. Only where every layer keeps all its keys
(full attention): a sliding-window layer drops keys, so those architectures prefill anew.
Scores equal a fresh prefill to float rounding (tested on every registered architecture).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache

from fear_assets.lm.requests import (GENERATE, LOGLIKELIHOOD, NEXT_TOKEN, ContinuationScore, Request,
                                     Response)

__all__ = ["ContinuationScore", "GenerationState", "Request", "Response", "TeacherForcedEngine", "encode_pair",
           "inference_mode", "naive_scores", "naive_greedy"]

FULL, SLIDING = "full_attention", "sliding_attention"


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


#: Tokens per forward of a long prefix under the eager kernel (registered for Gemma-2, whose
#: soft-capping the fused kernels lack), which materialises each layer's [heads, n, n] score
#: matrix: chunks keep it small. Measured on the Gemma-2 stand-in at 6,144 tokens: 2.2x faster
#: than one pass (1,024: 1.7x). The fused SDPA kernel is faster in one pass (0.46x chunked at
#: 16,384), so it keeps one (benchmarks/prefill_chunks.py).
EAGER_PREFILL_CHUNK = 512


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    import torch
    return torch.log_softmax(logits.float(), dim=-1)


def layer_kinds(config) -> list[str]:
    """Attention kind of every decoder layer: ``layer_types`` where the config has it
    (Qwen2, Gemma-2), else every layer sliding when a window is set (Mistral), else full."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types:
        return [SLIDING if t == SLIDING else FULL for t in types[:n]]
    return [SLIDING if getattr(config, "sliding_window", None) else FULL] * n


def _view(cache) -> DynamicCache:
    """A cache object sharing the prefix's tensors: a forward through it appends to the view
    (new tensors), never to the prefix cache, so the prefix is reused without a copy."""
    view = copy.copy(cache)
    view.layers = [copy.copy(layer) for layer in cache.layers]
    return view


def inference_mode(fn):
    """``torch.inference_mode()`` as a decorator that imports torch on the first call: the
    engine's module is imported wherever the Dagster definitions are (the UI's code server,
    every run and step process), and only the processes that score need torch."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)

    return wrapper


@functools.cache
def _decode_layer_type():
    """``_DecodeLayer``, defined on first use (its base class is transformers')."""
    from transformers.cache_utils import DynamicLayer

    class _DecodeLayer(DynamicLayer):
        """A full-attention cache layer for batched decoding: the documents' left-padded keys in
        a buffer with room for every new token, written in place (no copy of the cache per step,
        as ``torch.cat`` in a dynamic layer would make)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
            super().__init__()
            self._k = keys.new_zeros((*keys.shape[:2], keys.shape[2] + room, keys.shape[3]))
            self._v = values.new_zeros((*values.shape[:2], values.shape[2] + room, values.shape[3]))
            self._k[:, :, : keys.shape[2]] = keys
            self._v[:, :, : values.shape[2]] = values
            self._n = keys.shape[2]
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]
            self.device, self.dtype, self.is_initialized = keys.device, keys.dtype, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            m = key_states.shape[-2]
            self._k[:, :, self._n: self._n + m] = key_states
            self._v[:, :, self._n: self._n + m] = value_states
            self._n += m
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]
            return self.keys, self.values

    return _DecodeLayer


@dataclass
class GenerationState:
    """A document's cache after its prompt, ready for greedy decoding (one row)."""

    keys: list[torch.Tensor]  # per layer [1, kv_heads, K_layer, head_dim]
    values: list[torch.Tensor]
    positions: dict[str, torch.Tensor]  # per attention kind, the positions of its layers' keys [K_kind]
    next_position: int
    last_logits: torch.Tensor  # [vocab]
    max_new_tokens: int
    eos_ids: tuple[int, ...]


class TeacherForcedEngine:
    """Executes requests on one loaded causal LM.

    ``pack_tokens`` bounds the packed row of one forward (prompts + continuations); a list
    that needs more runs in several forwards from the same prefix cache. ``generation_batch``
    is how many documents decode together. ``prefill_chunk`` bounds one forward of a long
    prefix (None: :data:`EAGER_PREFILL_CHUNK` for the eager kernel, one pass otherwise)."""

    def __init__(self, model, pack_tokens: int = 1024, generation_batch: int = 16, reuse_prefix: bool = True,
                 prefill_chunk: int | None = None):
        attn = getattr(model.config, "_attn_implementation", None) or ""
        if attn.startswith("flash") or attn == "flex_attention":
            # Packed continuations and batched decoding pass 4D masks, which these kernels
            # do not take as given.
            raise ValueError(f"attention implementation {attn!r} does not take the engine's 4D masks; load the "
                             f"model with attn_implementation='sdpa' (or 'eager') in the settings' models section")
        self.model = model.eval()
        self.device = _device(model)
        self.pack_tokens = int(pack_tokens)
        if prefill_chunk is None:
            prefill_chunk = EAGER_PREFILL_CHUNK if attn == "eager" else 0
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0: one pass), got {prefill_chunk}")
        self.prefill_chunk = int(prefill_chunk)
        self.generation_batch = int(generation_batch)
        self.kinds = layer_kinds(model.config)
        self.window = getattr(model.config, "sliding_window", None)
        self._first_of = {k: self.kinds.index(k) for k in dict.fromkeys(self.kinds)}
        self.reuse_prefix = bool(reuse_prefix)
        self._last_prefix: tuple[list[int], object, torch.Tensor] | None = None  # (ids, cache, last logits)
        self.reused_tokens = 0  # prefix tokens taken from the previous prefix's cache (not recomputed)

    # -- primitives ---------------------------------------------------------------------
    def _chunks(self, n: int, keep_logits: int) -> list[tuple[int, int]]:
        """[start, end) of each forward over ``n`` new prefix tokens: at most ``prefill_chunk``
        each (one forward where it is 0), the last one long enough to hold the ``keep_logits``
        positions whose logits are kept."""
        step = self.prefill_chunk or max(n, 1)
        bounds = [(s, min(s + step, n)) for s in range(0, n, step)]
        while len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < keep_logits:
            bounds[-2:] = [(bounds[-2][0], bounds[-1][1])]
        return bounds

    @inference_mode
    def prefill(self, ids: Sequence[int], keep_logits: int = 1):
        """Run ``ids`` into a new cache; returns (cache, logits of the last ``keep_logits``
        positions, outputs of the last forward).

        A prefix longer than ``prefill_chunk`` runs in chunks through the cache, as
        ``generate(prefill_chunk_size=...)`` does: the same scores (each query still sees every
        key before it, sliding windows included)."""
        import torch
        if not len(ids):
            raise ValueError("the shared prefix is empty; a request list needs at least one prefix token")
        ids = list(ids)
        (start, end), *rest = self._chunks(len(ids), keep_logits)
        x = torch.tensor([ids[start:end]], device=self.device)
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep_logits if not rest else 1)
        cache = out.cache
        if rest:
            _, out = self.extend(cache, ids[rest[0][0]:], keep_logits=keep_logits)
        return cache, out.logits[0], out

    @inference_mode
    def extend(self, cache, ids: Sequence[int], keep_logits: int = 1):
        """Append ``ids`` to a batch-1 cache (in place; more than ``prefill_chunk`` in chunks);
        returns (logits of the last ``keep_logits`` positions, outputs of the last forward)."""
        import torch
        ids = list(ids)
        chunks = self._chunks(len(ids), keep_logits)
        for k, (a, b) in enumerate(chunks):
            start = cache.get_seq_length()
            x = torch.tensor([ids[a:b]], device=self.device)
            positions = torch.arange(start, start + b - a, device=self.device)
            out = self.model(input_ids=x, cache=cache, use_cache=True, position_ids=positions[None],
                             cache_position=positions, logits_to_keep=keep_logits if k == len(chunks) - 1 else 1)
        return out.logits[0], out

    @inference_mode
    def prefix_cache(self, ids: Sequence[int]):
        """(cache, last logits) of ``ids``: with ``reuse_prefix``, the previous prefix's cache
        cut at their longest common head (at most all but the last token of ``ids``) and
        extended by the rest; otherwise (or with nothing to reuse) one prefill."""
        from transformers.cache_utils import DynamicLayer
        ids = list(ids)
        last = self._last_prefix if self.reuse_prefix else None
        if last is not None:
            previous, cache, logits = last
            n = 0
            for a, b in zip(ids, previous):
                if a != b:
                    break
                n += 1
            if n == len(ids) == len(previous):
                self.reused_tokens += n
                return cache, logits
            n = min(n, len(ids) - 1)
            if n > 0 and all(type(layer) is DynamicLayer and layer.keys.shape[-2] == len(previous)
                             for layer in cache.layers):
                head = _view(cache)
                for layer in head.layers:
                    layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]
                logits, _ = self.extend(head, ids[n:], keep_logits=1)
                self.reused_tokens += n
                self._last_prefix = (ids, head, logits[-1])
                return head, logits[-1]
        cache, logits, _ = self.prefill(ids, keep_logits=1)
        if self.reuse_prefix:
            self._last_prefix = (ids, cache, logits[-1])
        return cache, logits[-1]

    def _stored_positions(self, cache) -> dict[str, torch.Tensor]:
        """Positions of the keys each attention kind keeps in ``cache`` (a sliding layer keeps
        only its last window - 1 keys)."""
        import torch
        n_ctx = cache.get_seq_length()
        out = {}
        for kind, i in self._first_of.items():
            stored = cache.layers[i].keys.shape[-2]
            out[kind] = torch.arange(n_ctx - stored, n_ctx, device=self.device)
        return out

    def _mask(self, kind: str, key_pos: torch.Tensor, q_pos: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Additive mask [B, 1, Q, K] from a boolean [B, Q, K]; the window from positions."""
        import torch
        if kind == SLIDING and self.window:
            allowed = allowed & ((q_pos[..., :, None] - key_pos[..., None, :]) < self.window)
        dtype = self.model.dtype
        zero = torch.zeros((), dtype=dtype, device=self.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]

    def _attention_mask(self, masks: dict[str, torch.Tensor]):
        # One kind: a single 4D mask (every model takes it as is); mixed kinds: the per-kind
        # mapping that Qwen2 and Gemma-2 accept in place of building their own.
        return next(iter(masks.values())) if len(masks) == 1 else masks

    # -- packed scoring -----------------------------------------------------------------
    def _plan(self, groups: "OrderedDict[tuple[int, ...], list[int]]", requests: Sequence[Request],
              n_ctx: int | None = None):
        """Chunks of (prompt, request indices) whose packed rows fit the packing bound; a prompt
        whose continuations do not fit in one chunk is repeated in the next. The bound is
        ``pack_tokens``, lowered to max(256, prefix length) after a short prefix: the packed
        row's attention is computed over the whole row (masked), so a row much longer than
        the prefix spends most of its attention on masked blocks."""
        budget = self.pack_tokens if n_ctx is None else min(self.pack_tokens, max(256, n_ctx))
        chunks, current, size = [], [], 0
        for prompt, idx in groups.items():
            part, part_size = [], len(prompt)
            for i in idx:
                r = requests[i]
                cost = max(0, len(r.continuation) - 1) if r.kind == LOGLIKELIHOOD else 0
                if part and part_size + cost > budget:
                    if current and size + part_size > budget:
                        chunks.append(current)
                        current, size = [], 0
                    current.append((prompt, part))
                    size += part_size
                    part, part_size = [], len(prompt)
                part.append(i)
                part_size += cost
            if current and size + part_size > budget:
                chunks.append(current)
                current, size = [], 0
            current.append((prompt, part))
            size += part_size
        if current:
            chunks.append(current)
        return chunks

    @inference_mode
    def _packed_pass(self, cache, prefix_last: torch.Tensor, chunk, requests: Sequence[Request],
                     responses: list, states: dict, hook: Callable[[object], ContextManager] | None):
        """One forward over a chunk's prompts and continuations from ``cache`` (not modified)."""
        import torch
        n_ctx = cache.get_seq_length()
        ids: list[int] = []
        q_pos: list[int] = []
        seg: list[int] = []
        parent: list[int] = []  # per segment, the prompt segment it sees (itself for a prompt)
        prompt_at: list[tuple[int, int]] = []  # per group: (start in row, length)
        cont_at: dict[int, tuple[int, int]] = {}  # request -> (start in row, length)
        for g, (prompt, idx) in enumerate(chunk):
            p_seg = len(parent)
            parent.append(p_seg)
            prompt_at.append((len(ids), len(prompt)))
            ids += prompt
            q_pos += range(n_ctx, n_ctx + len(prompt))
            seg += [p_seg] * len(prompt)
            for i in idx:
                r = requests[i]
                if r.kind != LOGLIKELIHOOD or len(r.continuation) < 2:
                    continue
                body = r.continuation[:-1]
                s = len(parent)
                parent.append(p_seg)
                cont_at[i] = (len(ids), len(body))
                ids += body
                q_pos += range(n_ctx + len(prompt), n_ctx + len(prompt) + len(body))
                seg += [s] * len(body)
        lp: torch.Tensor | None = None  # log-softmax of the kept rows, in row order
        row_of: dict[int, int] = {}  # packed row index -> its row in lp
        recorded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        stored = self._stored_positions(cache)
        if ids:
            T = len(ids)
            seg_t = torch.tensor(seg, device=self.device)
            parent_t = torch.tensor(parent, device=self.device)
            idx_t = torch.arange(T, device=self.device)
            # A query sees a packed key of its own segment (causally) or of its prompt segment.
            same = seg_t[None, :] == seg_t[:, None]
            own_prompt = seg_t[None, :] == parent_t[seg_t][:, None]
            packed = (same | own_prompt) & (idx_t[None, :] <= idx_t[:, None])
            qp = torch.tensor(q_pos, device=self.device)
            masks = {}
            for kind, spos in stored.items():
                allowed = torch.cat([torch.ones((T, len(spos)), dtype=torch.bool, device=self.device), packed], 1)
                masks[kind] = self._mask(kind, torch.cat([spos, qp])[None], qp[None], allowed[None])
            keep = sorted({start + length - 1 for start, length in prompt_at if length}
                          | {j for start, length in cont_at.values() for j in range(start, start + length)})
            view = _view(cache)
            for li, layer in enumerate(view.layers):
                original = layer.update

                def update(*args, _original=original, _li=li, **kwargs):
                    kv = _original(*args, **kwargs)
                    recorded[_li] = kv
                    return kv

                layer.update = update
            with hook(view) if hook is not None else contextlib.nullcontext():
                out = self.model(input_ids=torch.tensor([ids], device=self.device),
                                 attention_mask=self._attention_mask(masks), position_ids=qp[None], cache=view,
                                 use_cache=True, logits_to_keep=torch.tensor(keep, device=self.device))
            lp = _log_softmax(out.logits[0])
            row_of = {j: k for k, j in enumerate(keep)}
        for g, (prompt, idx) in enumerate(chunk):
            start, length = prompt_at[g]
            last = lp[row_of[start + length - 1]] if length else _log_softmax(prefix_last)
            top: int | None = None  # the argmax of ``last``, shared by the group's requests
            for i in idx:
                r = requests[i]
                if r.kind == LOGLIKELIHOOD:
                    cont = r.continuation
                    lps = [float(last[cont[0]])]
                    top = int(last.argmax()) if top is None else top
                    greedy = top == cont[0]
                    if i in cont_at:
                        c_start, c_len = cont_at[i]
                        # A view, not a copy: ``keep`` is sorted and holds every continuation row.
                        k0 = row_of[c_start]
                        rows = lp[k0:k0 + c_len]
                        targets = torch.tensor(cont[1:], device=self.device)
                        lps += rows.gather(-1, targets[:, None])[:, 0].tolist()
                        greedy = greedy and bool((rows.argmax(-1) == targets).all())
                    responses[i] = Response(score=ContinuationScore(tuple(lps), greedy))
                elif r.kind == NEXT_TOKEN:
                    if r.choice_ids is None:
                        responses[i] = Response(distribution=last.clone())
                    else:
                        responses[i] = Response(logprobs=tuple(float(last[t]) for t in r.choice_ids))
                elif r.kind == GENERATE and i not in states:
                    states[i] = self._state(cache, stored, recorded, start, length, last, r)

    def _state(self, cache, stored, recorded, start: int, length: int, last: torch.Tensor,
               request: Request) -> GenerationState:
        """The cache of prefix + prompt, cut out of the packed forward's keys (a view when the
        prompt opens the row, as the caller's first prompt does)."""
        import torch
        keys, values = [], []
        for li, layer in enumerate(cache.layers):
            n_stored = layer.keys.shape[-2]
            if length == 0:
                keys.append(layer.keys)
                values.append(layer.values)
                continue
            k, v = recorded[li]
            if start == 0:
                keys.append(k[:, :, : n_stored + length])
                values.append(v[:, :, : n_stored + length])
            else:
                a, b = n_stored + start, n_stored + start + length
                keys.append(torch.cat([k[:, :, :n_stored], k[:, :, a:b]], dim=-2))
                values.append(torch.cat([v[:, :, :n_stored], v[:, :, a:b]], dim=-2))
        n_ctx = cache.get_seq_length()
        prompt_pos = torch.arange(n_ctx, n_ctx + length, device=self.device)
        positions = {kind: torch.cat([spos, prompt_pos]) for kind, spos in stored.items()}
        return GenerationState(keys, values, positions, n_ctx + length, last, request.max_new_tokens,
                               tuple(request.eos_ids))

    @inference_mode
    def from_cache(self, cache, last_logits: "torch.Tensor | None", requests: Sequence[Request],
                   hook: Callable[[object], ContextManager] | None = None
                   ) -> tuple[list[Response | None], dict[int, GenerationState]]:
        """Every request in packed forwards from the cache of its shared prefix (left
        unchanged); ``last_logits`` are the prefix's last logits (read by requests with an
        empty prompt). Returns the responses (``None`` at generate requests) and, per
        generate request, its :class:`GenerationState` for :meth:`generate`. ``hook(cache)``
        is a context manager active during the first packed forward (attention and residual
        captures); the first request's prompt opens that forward's row, at its own positions."""
        groups: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()
        for i, r in enumerate(requests):
            groups.setdefault(tuple(r.prompt), []).append(i)
        if last_logits is None and () in groups:
            raise ValueError("requests with an empty prompt need the prefix's last logits")
        responses: list[Response | None] = [None] * len(requests)
        states: dict[int, GenerationState] = {}
        for c, chunk in enumerate(self._plan(groups, requests, cache.get_seq_length())):
            self._packed_pass(cache, last_logits, chunk, requests, responses, states, hook if c == 0 else None)
        return responses, states

    @inference_mode
    def start(self, prefix_ids: Sequence[int], requests: Sequence[Request],
              hook: Callable[[object], ContextManager] | None = None
              ) -> tuple[list[Response | None], dict[int, GenerationState]]:
        """The prefix's cache (:meth:`prefix_cache`: one prefill, or the previous prefix's
        head extended), then :meth:`from_cache`."""
        cache, last = self.prefix_cache(prefix_ids)
        return self.from_cache(cache, last, requests, hook)

    # -- batched greedy generation --------------------------------------------------------
    @inference_mode
    def generate(self, states: Sequence[GenerationState]) -> list[tuple[list[int], bool]]:
        """Greedy tokens for every state, ``generation_batch`` documents per decoding batch;
        returns (tokens, truncated by max_new_tokens) per state."""
        out: list[tuple[list[int], bool]] = []
        for i in range(0, len(states), max(1, self.generation_batch)):
            out += self._greedy_batch(states[i: i + max(1, self.generation_batch)])
        return out

    def _greedy_batch(self, states: Sequence[GenerationState]) -> list[tuple[list[int], bool]]:
        import torch
        from transformers.cache_utils import Cache
        B = len(states)
        room = max(s.max_new_tokens for s in states)
        layers = []
        for li in range(len(self.kinds)):
            width = max(s.keys[li].shape[-2] for s in states)
            k0 = states[0].keys[li]
            k = k0.new_zeros((B, k0.shape[1], width, k0.shape[3]))
            v = states[0].values[li].new_zeros((B, k0.shape[1], width, states[0].values[li].shape[3]))
            for b, s in enumerate(states):  # left padding: every row's last key is its newest
                n = s.keys[li].shape[-2]
                k[b, :, width - n:] = s.keys[li][0]
                v[b, :, width - n:] = s.values[li][0]
            layers.append(_decode_layer_type()(k, v, room))
            del k, v
        cache = Cache(layers=layers)
        key_pos, valid = {}, {}
        for kind in self._first_of:
            width = max(len(s.positions[kind]) for s in states)
            key_pos[kind] = torch.full((B, width), -1, dtype=torch.long, device=self.device)
            valid[kind] = torch.zeros((B, width), dtype=torch.bool, device=self.device)
            for b, s in enumerate(states):
                n = len(s.positions[kind])
                key_pos[kind][b, width - n:] = s.positions[kind]
                valid[kind][b, width - n:] = True
        pos = torch.tensor([s.next_position for s in states], device=self.device)
        logits = torch.stack([s.last_logits for s in states])
        tokens: list[list[int]] = [[] for _ in states]
        done = [False] * B
        truncated = [False] * B
        while True:
            nxt = logits.argmax(-1)
            for b, s in enumerate(states):
                if done[b]:
                    continue
                t = int(nxt[b])
                if t in s.eos_ids:
                    done[b] = True
                    continue
                tokens[b].append(t)
                if len(tokens[b]) >= s.max_new_tokens:
                    done[b], truncated[b] = True, True
            if all(done):
                break
            masks = {}
            for kind in key_pos:
                key_pos[kind] = torch.cat([key_pos[kind], pos[:, None]], 1)
                valid[kind] = torch.cat([valid[kind], torch.ones((B, 1), dtype=torch.bool, device=self.device)], 1)
                masks[kind] = self._mask(kind, key_pos[kind], pos[:, None], valid[kind][:, None, :])
            out = self.model(input_ids=nxt[:, None], attention_mask=self._attention_mask(masks),
                             position_ids=pos[:, None], cache=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()
            pos = pos + 1
        return [(t, tr) for t, tr in zip(tokens, truncated)]


@inference_mode
def naive_scores(model, context_ids: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[ContinuationScore]:
    """Reference: one full forward per continuation, no cache (what the engine must equal)."""
    import torch
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


@inference_mode
def naive_greedy(model, ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = ()) -> tuple[list[int], bool]:
    """Reference: greedy decoding with one full forward per token, no cache."""
    import torch
    device = _device(model)
    ids, out = list(ids), []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1].argmax())
        if token in set(eos_ids):
            return out, False
        out.append(token)
        ids.append(token)
    return out, True
