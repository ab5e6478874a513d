"""Positive controls (protocol 4.6, D4): contrasts signed so the predicted direction is
positive, from the primary model fitted on the control cells against the matched primary
cells, averaged over the depth band; a control passes if its posterior mean is at least the
SESOI and its 99% HDI lies wholly above zero.

The control and the matched primary cells are fitted separately with the registered model
(same frames, depths and structure); a contrast between them is the difference of the two
posteriors' band-averaged cell means, draw by draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

#: D4's four controls: name -> (control block suffix, kind of contrast).
CONTROLS = {
    "addressee_name": "control_addressee_name",
    "instructed_interaction": "control_instructed_interaction",
    "instructed_priority": "control_instructed_priority",
    "marked_priority": "control_marked_priority",
}

CellMeans = Mapping[tuple[str, str], np.ndarray]


def _effect(mu: CellMeans, agent: str) -> np.ndarray:
    return mu[(agent, "threat")] - mu[(agent, "harmless")]


def _all_cells(mu: CellMeans) -> np.ndarray:
    return np.mean(list(mu.values()), axis=0)


def addressee_contrast(control: CellMeans) -> np.ndarray:
    """1. Delta(addressee) - Delta(other person), over both contents."""
    return (np.mean([control[("addressee", c)] for c in ("threat", "harmless")], axis=0)
            - np.mean([control[("other_person", c)] for c in ("threat", "harmless")], axis=0))


def instructed_interaction_contrast(control: CellMeans, primary: CellMeans) -> np.ndarray:
    """2. ([peer T - peer H] - [person T - person H]) in the control minus the same in primary."""
    return ((_effect(control, "peer") - _effect(control, "person"))
            - (_effect(primary, "peer") - _effect(primary, "person")))


def priority_contrast(control: CellMeans, primary: CellMeans) -> np.ndarray:
    """3 and 4. Delta(control) - Delta(primary), all cells."""
    return _all_cells(control) - _all_cells(primary)


CONTRASTS: dict[str, Callable[..., np.ndarray]] = {
    "addressee_name": lambda control, primary: addressee_contrast(control),
    "instructed_interaction": instructed_interaction_contrast,
    "instructed_priority": priority_contrast,
    "marked_priority": priority_contrast,
}


@dataclass(frozen=True)
class ControlVerdict:
    control: str
    mean: float
    hdi_low: float
    hdi_high: float
    passed: bool
    reason: str


def control_verdict(name: str, draws: np.ndarray, hdi_prob: float, min_mean: float, hdi_above: float) -> ControlVerdict:
    """D4's pass rule: posterior mean >= ``min_mean`` (the SESOI) and the HDI wholly above
    ``hdi_above`` (zero)."""
    import arviz as az

    low, high = (float(x) for x in az.hdi(np.asarray(draws), hdi_prob=hdi_prob))
    mean = float(np.mean(draws))
    problems = []
    if mean < min_mean:
        problems.append(f"posterior mean {mean:.3f} < {min_mean}")
    if low <= hdi_above:
        problems.append(f"{hdi_prob:.0%} HDI [{low:.3f}, {high:.3f}] not wholly above {hdi_above}")
    return ControlVerdict(name, mean, low, high, not problems, "; ".join(problems) or "passes")


def verdict_rows(verdicts: Sequence[ControlVerdict]) -> list[dict]:
    return [v.__dict__.copy() for v in verdicts]
