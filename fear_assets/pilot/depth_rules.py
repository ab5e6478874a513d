"""Depth band (H1-H4) and H5 depth from pilot frames only (protocol 5).

Neither rule reads any agent-by-content contrast: both pool all six cells.
"""

from __future__ import annotations

from typing import Mapping


def depth_band(mention_rate: Mapping[int, float], low: float, high: float, min_depths: int,
               target: float) -> tuple[list[int], str]:
    """Depths at which the generated report mentions the neutral partner on low..high of
    trials; if fewer than ``min_depths`` qualify, the ``min_depths`` depths closest to
    ``target`` (ties to the shallower depth). Returns (depth indices, rule applied)."""
    qualifying = sorted(d for d, r in mention_rate.items() if low <= r <= high)
    if len(qualifying) >= min_depths:
        return qualifying, f"neutral-partner mention rate within [{low:.2f}, {high:.2f}]"
    closest = sorted(mention_rate, key=lambda d: (abs(mention_rate[d] - target), d))[:min_depths]
    return sorted(closest), (f"fallback: fewer than {min_depths} depths within [{low:.2f}, {high:.2f}]; "
                             f"the {min_depths} closest to {target:.2f}")


def h5_depth(accuracy: Mapping[int, float], low: float, high: float, target: float) -> tuple[int, str]:
    """The deepest depth whose pooled forced-choice accuracy lies in low..high; otherwise the
    depth closest to ``target`` (ties to the deeper depth)."""
    qualifying = [d for d, a in accuracy.items() if low <= a <= high]
    if qualifying:
        return max(qualifying), f"deepest depth with accuracy within [{low:.2f}, {high:.2f}]"
    best = min(accuracy, key=lambda d: (abs(accuracy[d] - target), -d))
    return best, f"fallback: no depth within [{low:.2f}, {high:.2f}]; closest to {target:.2f}"
