"""The pilot estimates of the blocks that have their own scale (protocol 6.3: "all fixed effects
and variance components at their pilot estimates"; 6.2): gate (b)'s recall Delta and gate
(c)'s judge.

- Gate (b): the registered primary model fitted on the pilot's recall Delta, on the rows that
  have one, as the confirmatory gate (b) is fitted (``analysis.gate_b.recall_rows``); its
  posterior means (fixed effects, frame and unit SDs, sigma, nu) generate the simulated recall
  block. A pilot that scored no recall falls back to the report fit, said so.
- Gate (c): the judge's pilot trial-level residual SD, the value gate (c)'s analysis
  standardises the judge by (``pilot_controls``' ``pilot_sigma_judge``: the primary model on
  the pilot's judge block, ``pilot.gate_c_scale.reader_sigma``, the registration record's
  value), read rather than fitted a second time so that both use one number. A pilot that
  scored no judge block falls back to the tested model's scale, said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.gate_b import recall_rows
from fear_assets.core.numbers import number
from fear_assets.models.fits import fit_cells
from fear_assets.simulation.generator import pilot_estimates

#: Said where gate (b) falls back to the report fit.
NO_RECALL = "gate (b) generated from the report fit: the pilot scored no recall"
#: Said where gate (c)'s judge falls back to the tested model's scale.
NO_JUDGE = "gate (c)'s judge generated at the tested model's residual scale: the pilot scored no judge block"
JUDGE_NOT_FINITE = ("gate (c)'s judge generated at the tested model's residual scale: the judge's pilot residual "
                    "has no finite SD (nu <= 2; the gate_c_scale registration gate fails)")


@dataclass(frozen=True)
class RecallPilot:
    """Gate (b)'s pilot estimates (``PilotEstimates.as_dict`` of the recall fit; None: the
    pilot scored no recall) and what the step says about them."""

    estimates: Mapping | None
    trials: int
    note: str
    max_rhat: float | None = None


def recall_pilot_fit(fitter, table: pd.DataFrame, fears: Sequence[str], band: Sequence[str],
                     seed: int) -> RecallPilot:
    """6.3's pilot estimates of gate (b): the registered primary model on the pilot's recall
    Delta (``table``: the pilot's primary model table with ``delta_recall``), posterior means.
    Rows without a recall Delta leave the fit; where the H2 contrast cannot be formed on the
    recall branch (no recall scored) the estimates are None and the note says gate (b) is
    generated from the report fit."""
    rows = recall_rows(table, band) if "delta_recall" in table.columns else None
    if rows is None or not rows.scored:
        why = "no recall Delta column" if rows is None else rows.note
        return RecallPilot(None, 0, f"{NO_RECALL} ({why})")
    fit = fit_cells(fitter, rows.data, fears, band, seed, "pilot_recall")
    est = pilot_estimates(fit.idata, fit.data, {})
    return RecallPilot(est.as_dict(), len(rows.data),
                       f"the pilot's recall fit ({number(len(rows.data), 'count')} trials; sigma "
                       f"{number(est.sigma)}, nu {number(est.nu)})", fit.diagnostics["max_rhat"])


def pilot_judge_sigma(pilot_controls: pd.DataFrame) -> float | None:
    """Gate (c)'s judge scale: the judge's pilot trial-level residual SD as gate (c)'s
    analysis reads it (``pilot_sigma_judge``, one value on every row); None where the pilot
    scored no judge block (NaN) or the table predates the column."""
    if "pilot_sigma_judge" not in pilot_controls.columns:
        return None
    values = pd.to_numeric(pilot_controls["pilot_sigma_judge"], errors="coerce").dropna().unique()
    if len(values) == 0:
        return None
    if len(values) == 1 and values[0] == np.inf:
        # No finite SD (nu <= 2 in the judge's pilot fit): the gate_c_scale registration gate
        # fails; the simulated judge takes the tested model's scale and the note says why.
        return None
    if len(values) > 1 or not (np.isfinite(values[0]) and values[0] > 0):
        raise ValueError(f"pilot_controls holds judge sigmas {sorted(values.tolist())}: one positive value "
                         "is expected; re-materialise pilot_controls")
    return float(values[0])


def judge_note(judge_sigma: float | None, pilot_controls: pd.DataFrame | None = None) -> str:
    """What the step says about gate (c)'s judge scale."""
    if judge_sigma is None:
        stored = (pd.to_numeric(pilot_controls["pilot_sigma_judge"], errors="coerce")
                  if pilot_controls is not None and "pilot_sigma_judge" in pilot_controls.columns else pd.Series([]))
        return JUDGE_NOT_FINITE if (stored == np.inf).any() else NO_JUDGE
    return f"the judge's pilot residual SD {number(judge_sigma)} (pilot_controls, as gate (c) reads it)"
