"""Internal readouts of one branch extension (protocol 4.5, 5): attention mass and
residual-stream features, taken with hooks so the fused attention kernel stays.

Attention mass: the mean attention weight from the question tokens to a sentence's tokens,
over all heads of the later two-thirds of layers. Only the question rows of the attention
matrix are computed (queries re-projected from the captured layer input, keys read from
the KV cache), never the full T x T matrix.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence

from fear_assets.lm.engine import inference_mode

if TYPE_CHECKING:
    import torch


def later_layers(n_layers: int, fraction_from: float) -> list[int]:
    """Indices of the later two-thirds of layers (registered fraction)."""
    start = int(math.floor(n_layers * fraction_from))
    return list(range(start, n_layers))


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return model.model.layers


class AttentionCapture:
    """Captures each selected layer's attention input (hidden states, rotary embeddings)."""

    def __init__(self, model, layers: Sequence[int]):
        self.model = model
        self.layers = list(layers)
        self.inputs: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}

    @contextmanager
    def active(self, cache) -> Iterator["AttentionCapture"]:
        """Capture during one forward that extends ``cache``. The keys are taken from what
        the cache returns to attention (sliding-window layers evict old keys afterwards)."""
        handles = []
        self.keys: dict[int, torch.Tensor] = {}
        patched = []
        for i in self.layers:
            layer = cache.layers[i]
            original = layer.update

            def update(*args, _original=original, _i=i, **kwargs):
                keys, values = _original(*args, **kwargs)
                self.keys[_i] = keys.detach()
                return keys, values

            layer.update = update
            patched.append(layer)
        for i in self.layers:
            attn = decoder_layers(self.model)[i].self_attn

            def hook(module, args, kwargs, i=i):
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                self.inputs[i] = (hidden.detach(), kwargs["position_embeddings"])

            handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for layer in patched:
                del layer.update  # back to the class method

    @inference_mode
    def mass(self, question: Sequence[int], spans: Sequence[tuple[int, int]], start: int) -> list[float]:
        """Mean attention from the question positions to each key span.

        ``question`` indexes the captured positions (0 = the first token of the extension,
        whose absolute position is ``start``); ``spans`` are absolute [a, b) token ranges."""
        import torch
        totals = torch.zeros(len(spans), dtype=torch.float64)
        for i in self.layers:
            attn = decoder_layers(self.model)[i].self_attn
            hidden, (cos, sin) = self.inputs[i]
            rows = torch.tensor(list(question), device=hidden.device)
            h = hidden[:, rows]
            head_dim = attn.head_dim
            q = attn.q_proj(h).view(1, len(rows), -1, head_dim).transpose(1, 2)
            rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
            q, _ = rope(q, q, cos[:, rows], sin[:, rows])
            keys = self.keys[i][:1]
            n_kv = keys.shape[1]
            keys = keys.repeat_interleave(q.shape[1] // n_kv, dim=1)
            total = start + hidden.shape[1]
            key_pos = torch.arange(total - keys.shape[2], total, device=keys.device)
            q_pos = start + rows
            scores = (q.float() @ keys.float().transpose(-1, -2)) * attn.scaling
            softcap = getattr(attn, "attn_logit_softcapping", None)
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            allowed = key_pos[None, :] <= q_pos[:, None]
            window = attn.sliding_window if hasattr(attn, "sliding_window") else \
                getattr(attn.config, "sliding_window", None)
            if window:
                allowed &= key_pos[None, :] > q_pos[:, None] - window
            scores = scores.masked_fill(~allowed[None, None], float("-inf"))
            weights = torch.softmax(scores, dim=-1)[0]  # heads x question x keys
            for s, (a, b) in enumerate(spans):
                sel = (key_pos >= a) & (key_pos < b)
                totals[s] += float(weights[..., sel].sum(-1).mean())
        return (totals / len(self.layers)).tolist()


class ResidualCapture:
    """Forward hooks on the decoder layers: the residual stream (each layer's output) at one
    position of the next forward, averaged over the given layers. Nothing else is kept."""

    def __init__(self, model, layers: Sequence[int]):
        self.model = model
        self.layers = list(layers)
        self.position = 0
        self.captured: dict[int, torch.Tensor] = {}

    @contextmanager
    def active(self, position: int) -> Iterator["ResidualCapture"]:
        self.position, self.captured = position, {}
        handles = []
        for i in self.layers:
            def hook(module, args, output, i=i):
                hidden = output[0] if isinstance(output, tuple) else output
                self.captured[i] = hidden[0, self.position].detach().float().clone()

            handles.append(decoder_layers(self.model)[i].register_forward_hook(hook))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def mean(self) -> torch.Tensor:
        import torch
        return torch.stack([self.captured[i] for i in self.layers]).mean(0)
