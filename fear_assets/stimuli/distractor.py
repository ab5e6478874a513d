"""4.4: the shipping-notes distractor, cut to exactly the depth's token count.

Text comes from the bank's line templates, filled by a generator seeded from
(master seed, frame, rotation, depth), so the six cells of a unit (and every block that
shares the unit) see identical distractor text. The cut is made at a token boundary that
survives re-encoding in context: the span is exactly ``n_tokens`` tokens both alone and
between the line break before it and the line break after it.
"""

from __future__ import annotations

import string
from typing import Iterator, Mapping, Protocol, Sequence

import numpy as np

from fear_assets.core.errors import DesignError

_FORMATTER = string.Formatter()
#: What surrounds the distractor in every document (see templates.yaml "document").
LEFT_CONTEXT = ".\n"
RIGHT_CONTEXT = "\nEnd of log."


class Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


def _fill(slot: str, rng: np.random.Generator, vocab: Mapping[str, Sequence[str]]) -> str:
    if slot in vocab:
        words = vocab[slot]
        return words[int(rng.integers(len(words)))]
    generators = {
        "code": lambda: f"KL-{int(rng.integers(1000, 10000))}",
        "order": lambda: f"PO-{int(rng.integers(10000, 100000))}",
        "container": lambda: f"KSTU{int(rng.integers(1_000_000, 10_000_000))}",
        "plate": lambda: f"KT{int(rng.integers(10, 100))}-{int(rng.integers(100, 1000))}",
        "dock": lambda: str(int(rng.integers(1, 25))),
        "count": lambda: str(int(rng.integers(2, 61))),
        "count2": lambda: str(int(rng.integers(2, 61))),
        "weight": lambda: str(int(rng.integers(800, 24001))),
    }
    if slot not in generators:
        raise DesignError(f"distractor slot {{{slot}}} has no vocabulary: add it under distractor.vocab in templates.yaml")
    return generators[slot]()


def line_stream(templates: Mapping, seed: int) -> Iterator[str]:
    """An endless, seeded stream of shipping-note lines."""
    rng = np.random.default_rng(seed)
    lines = templates["distractor"]["lines"]
    vocab = templates["distractor"]["vocab"]
    while True:
        template = lines[int(rng.integers(len(lines)))]
        values = {name: _fill(name, rng, vocab) for _, name, _, _ in _FORMATTER.parse(template) if name}
        yield template.format(**values)


def _clean_cut(encoder: Encoder, text: str, ids: Sequence[int]) -> bool:
    """True when ``text`` is exactly ``ids`` alone and in its document context."""
    if not text or text[0].isspace() or text[-1].isspace():
        return False
    if encoder.encode(text, add_special_tokens=False) != list(ids):
        return False
    left = encoder.encode(LEFT_CONTEXT, add_special_tokens=False)
    right = encoder.encode(RIGHT_CONTEXT, add_special_tokens=False)
    joined = encoder.encode(LEFT_CONTEXT + text + RIGHT_CONTEXT, add_special_tokens=False)
    return joined == [*left, *ids, *right]


def build_distractor(encoder: Encoder, templates: Mapping, n_tokens: int, seed: int, max_attempts: int = 200) -> str:
    """Distractor text of exactly ``n_tokens`` tokens in ``encoder``'s tokenisation."""
    if n_tokens == 0:
        return ""
    stream = line_stream(templates, seed)
    lines: list[str] = []
    for attempt in range(max_attempts):
        # Grow the pool until it holds comfortably more than n_tokens tokens.
        while True:
            text = "\n".join(lines)
            ids = encoder.encode(text, add_special_tokens=False) if lines else []
            if len(ids) >= n_tokens + 8:
                break
            lines.extend(next(stream) for _ in range(max(4, (n_tokens - len(ids)) // 12 + 1)))
        cut_ids = ids[:n_tokens]
        cut = encoder.decode(cut_ids)
        if _clean_cut(encoder, cut, cut_ids):
            return cut
        # Unclean boundary (whitespace or a merge across it): drop the line the cut falls in
        # and try again; deterministic because the stream is seeded.
        del lines[cut.rstrip().count("\n")]
    raise DesignError(f"could not cut a clean {n_tokens}-token distractor in {max_attempts} attempts; "
                      "check that the tokenizer round-trips plain ASCII text")
