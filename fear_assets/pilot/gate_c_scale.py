"""Gate (c)'s scale from the pilot (6.2): each reader's trial-level residual SD.

6.2: "sigma is the trial-level residual standard deviation of the primary model in the pilot;
only the value of sigma is inserted at registration", and "each reader's contrast is
standardised by that reader's own trial-level residual standard deviation in the pilot".
Which pilot rows enter it, and which statistic of the fit is sigma, are decided here (under
the registered code hash); ``pilot_controls`` runs the fits.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import pandas as pd

from fear_assets.models.primary_model import ResidualSDNotFiniteError, implied_residual_sd
from fear_assets.core.settings import depth_index

#: The pilot block each reader's sigma is fitted on (the primary cells, read by that reader).
SIGMA_BLOCKS = {"tested": "pilot_primary", "judge": "pilot_judge"}


def sigma_depths(pilot_primary_depths: Iterable[str]) -> list[str]:
    """The depths sigma is taken over: every depth the pilot scored the primary cells at, not
    only the band. Reading taken: 6.2 names "the primary model in the pilot", and the pilot
    model spans every depth (the band only selects which depths H1-H3 average over); the
    band is itself fixed from these pilot data, so sigma does not wait on it."""
    return sorted(set(pilot_primary_depths), key=depth_index)


def reader_sigma(fit: Callable[[pd.DataFrame], Any], table: pd.DataFrame, reader: str) -> float:
    """One reader's pilot sigma: the residual SD implied by the primary model's Student-t fit
    (``implied_residual_sd``) on ``table``. The tested model's is required; a judge whose
    block is not scored has none (NaN, and gate (c) then says it is not available). Where half
    or more of the draws have nu <= 2 the residual has no finite SD: +inf, which fails the
    gate-(c)-scale registration gate (:func:`sigma_gate`) instead of stopping the pilot, so the
    positive controls and every other pilot gate are still read."""
    if table.empty:
        if reader == "tested":
            raise ValueError(f"gate (c)'s sigma: no {SIGMA_BLOCKS['tested']} rows in the pilot; score the pilot first")
        return float("nan")
    try:
        return implied_residual_sd(fit(table))
    except ResidualSDNotFiniteError:
        return math.inf


def sigma_gate(tested: float, judge: float | None) -> dict:
    """6.2's scale as a registration gate: "0.30/sigma and 0.15/sigma, where sigma is the
    trial-level residual standard deviation of the primary model in the pilot", and each reader
    standardised by its own. It passes when the tested model's sigma is finite and the judge's
    is finite or not scored (NaN: gate (c) is then not available, as the reading says); a
    Student-t residual with nu <= 2 has no SD, so gate (c) could not be computed."""
    def shown(value):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "not scored"
        return round(float(value), 6) if math.isfinite(value) else "not finite (nu <= 2 in half the draws or more)"

    problems = [f"the {reader} model's pilot residual has no finite SD (nu <= 2 in half the posterior draws or more)"
                for reader, value in (("tested", tested), ("judge", judge))
                if value is not None and not math.isnan(value) and not math.isfinite(value)]
    return {"passed": not problems, "numbers": {"tested sigma": shown(tested), "judge sigma": shown(judge)},
            "message": "; ".join(problems) + ": gate (c)'s ROPE and meaningful size cannot be set" if problems
            else "each reader's pilot residual SD is finite"}
