"""World statistics and resampling inference (protocol, "Primary estimands and inference").

"cross = [I(a1!=b1)+I(a1!=b2)+I(a2!=b1)+I(a2!=b2)] / 4; repeat = [I(a1!=a2)+I(b1!=b2)] / 2;
excess = cross - repeat. Negative estimates are retained; the observed world statistic
lies in [-0.5,1]."
"""

from __future__ import annotations

import math
import random
from typing import Sequence


def cross(a1: str, a2: str, b1: str, b2: str) -> float:
    return ((a1 != b1) + (a1 != b2) + (a2 != b1) + (a2 != b2)) / 4


def repeat(a1: str, a2: str, b1: str, b2: str) -> float:
    return ((a1 != a2) + (b1 != b2)) / 2


def excess(a1: str, a2: str, b1: str, b2: str) -> float:
    return cross(a1, a2, b1, b2) - repeat(a1, a2, b1, b2)


def half_l1(p: Sequence[float], q: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(p, q)) / 2


def equal_family_mean(values: dict[str, list[float]]) -> float | None:
    """"Average within each topology family, then weight the three family means equally."
    Undefined (None) if any family has no complete worlds."""
    if any(not v for v in values.values()):
        return None
    return sum(sum(v) / len(v) for v in values.values()) / len(values)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (the common 'type 7' definition)."""
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def stratified_bootstrap(values: dict[str, list[float]], draws: int, level: float,
                         rng: random.Random) -> tuple[float, float] | None:
    """Percentile interval of the equal-family mean over ``draws`` whole-forest resamples
    drawn with replacement within each family."""
    if any(not v for v in values.values()):
        return None
    families = list(values.values())
    stats = []
    for _ in range(draws):
        total = 0.0
        for v in families:
            n = len(v)
            total += sum([v[int(rng.random() * n)] for _ in range(n)]) / n
        stats.append(total / len(families))
    stats.sort()
    tail = (1 - level) / 2
    return percentile(stats, tail), percentile(stats, 1 - tail)


def sign_flip_p(values: dict[str, list[float]], draws: int, rng: random.Random,
                tolerance: float = 1e-12) -> float | None:
    """Two-sided sign-flip p-value of the equal-family mean with the plus-one correction:
    (1 + #{|T*| >= |T|}) / (1 + draws). World contrasts flip sign independently; the
    statistic keeps each family's weight. ``tolerance`` counts floating-point ties."""
    if any(not v for v in values.values()):
        return None
    k = len(values)
    # weights: each world's share in the equal-family mean.
    xs = [x / (len(v) * k) for v in values.values() for x in v]
    observed = abs(sum(xs))
    total = sum(xs)
    # Byte-sized lookup tables: the sum over the set bits of 8 worlds at a time.
    chunks = [xs[i:i + 8] for i in range(0, len(xs), 8)]
    tables = []
    for chunk in chunks:
        table = [0.0] * (1 << len(chunk))
        for mask in range(1, 1 << len(chunk)):
            low = mask & -mask
            table[mask] = table[mask ^ low] + chunk[low.bit_length() - 1]
        tables.append(table)
    extreme = 0
    for _ in range(draws):
        bits = rng.getrandbits(8 * len(chunks))
        positive = 0.0
        for table in tables:
            positive += table[bits & 0xFF] if len(table) == 256 else table[bits & (len(table) - 1)]
            bits >>= 8
        # flipped sum = (sum of kept) - (sum of flipped) = 2*kept - total
        if abs(2 * positive - total) >= observed - tolerance:
            extreme += 1
    return (1 + extreme) / (1 + draws)


def holm(p_values: dict[str, float | None], family_size: int) -> dict[str, float | None]:
    """Holm step-down adjusted p-values over a family of ``family_size``; an unavailable
    endpoint (None) keeps its place in the family and is never rejected."""
    available = sorted((p, name) for name, p in p_values.items() if p is not None)
    adjusted: dict[str, float | None] = {name: None for name in p_values}
    running = 0.0
    for i, (p, name) in enumerate(available):
        running = max(running, min(1.0, (family_size - i) * p))
        adjusted[name] = running
    return adjusted
