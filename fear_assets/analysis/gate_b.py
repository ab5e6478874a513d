"""Gate (b)'s data: H2 on the recall branch (protocol 4.5 "Non-evaluative recall", 6.2).

A trial without a recall Delta (its recall branch or baseline was not read) leaves the gate's
fit; it does not unscore the gate. The gate is not scored only when the H2 contrast cannot
be formed from the rows present: no recall Delta at all, or an agent x content cell with
none at a band depth. Either way the count of missing rows is reported, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from fear_assets.models.data import AGENTS, CONTENTS


@dataclass(frozen=True)
class RecallRows:
    data: pd.DataFrame | None  # the rows present with ``outcome`` = recall Delta; None: not scored
    missing: int  # primary rows without a recall Delta
    total: int
    note: str

    @property
    def scored(self) -> bool:
        return self.data is not None


def recall_rows(primary: pd.DataFrame, band: Sequence[str], column: str = "delta_recall") -> RecallRows:
    """Gate (b)'s model table: the primary model table with the recall Delta as outcome,
    fitted on the rows that have one. ``band``: the registered band depths ("d<index>"),
    at which every agent x content cell must keep at least one row for H2 to exist."""
    if column not in primary.columns:
        raise ValueError(f"the primary model table has no {column!r} column; score the recall branch "
                         "(readout 'recall') or build the table with data.model_table")
    present = primary[primary[column].notna()]
    total, missing = len(primary), int(primary[column].isna().sum())
    counted = f"{missing} of {total} primary rows lack a recall Delta"
    if present.empty:
        return RecallRows(None, missing, total, f"the recall branch was not read ({counted})")
    have = set(zip(present["agent"], present["content"], present["depth"]))
    holes = [f"{a}/{c}/{d}" for d in band for a in AGENTS for c in CONTENTS if (a, c, d) not in have]
    if holes:
        return RecallRows(None, missing, total, f"H2 cannot be formed on the recall branch: no recall Delta in "
                                                f"{', '.join(holes)} ({counted})")
    note = "H2 on the recall branch (gate b; also the recall estimand)"
    if missing:
        note += f"; {counted}, fitted on the {len(present)} present"
    return RecallRows(present.assign(outcome=present[column].astype(float)), missing, total, note)
