"""``precision.json`` (protocol, "Precision and power planning").

"precision.json reports normal-approximation planning for assumed world standard
deviations 0.20, 0.35, 0.50 and 0.75, using a conservative two-test Bonferroni critical
value. It also exactly enumerates the moments of several explicitly hypothetical
independent-copy categorical distributions. None is fitted to new observations."
Standard library only.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

from renaming_assets.analyzer.statistics import excess
from renaming_assets.settings import Settings


def bonferroni_critical_value(settings: Settings) -> float:
    """Two-sided z critical value at alpha / (number of primary tests)."""
    inf = settings.inference
    return NormalDist().inv_cdf(1 - inf.alpha / inf.family_size / 2)


def normal_power(effect: float, sd: float, n: int, z: float) -> float:
    se = sd / math.sqrt(n)
    return NormalDist().cdf(effect / se - z) + NormalDist().cdf(-effect / se - z)


def exact_moments(p: tuple[float, ...], q: tuple[float, ...], keys: tuple[str, ...]) -> dict[str, float]:
    """Mean and variance of the world excess when a1, a2 ~ p and b1, b2 ~ q independently,
    by enumerating all outcomes; with half the squared L2 distance for comparison."""
    mean = second = 0.0
    for a1, a2, b1, b2 in itertools.product(range(len(keys)), repeat=4):
        w = p[a1] * p[a2] * q[b1] * q[b2]
        if w:
            e = excess(keys[a1], keys[a2], keys[b1], keys[b2])
            mean += w * e
            second += w * e * e
    return {"mean": mean, "variance": max(0.0, second - mean * mean),
            "half_squared_l2": sum((x - y) ** 2 for x, y in zip(p, q)) / 2}


def precision_plan(settings: Settings) -> dict:
    c, inf, pre = settings.cohort, settings.inference, settings.precision
    n = c.worlds
    z = bonferroni_critical_value(settings)
    low, high = inf.excess_range
    return {
        "study": settings.study,
        "note": "Planning only: normal approximation, not a power guarantee for the registered sign-flip "
                "procedure; hypothetical distributions are not fitted to any observation.",
        "worlds": n,
        "alpha": inf.alpha,
        "tests": inf.family_size,
        "bonferroni_two_sided_z": z,
        "smallest_effect": inf.smallest_effect,
        "worst_case_sd_bound": (high - low) / 2,
        "by_world_sd": [
            {"sd": sd, "standard_error": sd / math.sqrt(n), "half_width": z * sd / math.sqrt(n),
             "power_at_smallest_effect": normal_power(inf.smallest_effect, sd, n, z)}
            for sd in pre.world_sds
        ],
        "hypothetical_categorical": [
            {"name": name, "original": list(p), "renamed": list(q), **exact_moments(p, q, c.keys)}
            for name, p, q in pre.hypothetical
        ],
    }
