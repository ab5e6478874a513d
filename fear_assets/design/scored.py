"""Which trials of a stored trial table a scoring step scores (4.5, 4.6, Appendix C step 2).

Pure selections of the trial table, under the registered code hash; the scoring assets only
run the model over what these return.
"""

from __future__ import annotations

import pandas as pd

from fear_assets.design.table import baseline_block_for


def scored_rows(settings, family_key: str, trial_table: pd.DataFrame) -> pd.DataFrame:
    """The rows a family's design scores now: every block but the pilot's positive controls
    (scored at the band depths, ``pilot_control_scores``), and for a reduced design only its
    scored blocks."""
    family = settings.family(family_key)
    table = trial_table[~trial_table["block"].isin(set(settings.positive_controls.pilot_blocks))]
    if family.reduced_design is not None:
        table = table[table["block"].map(family.reduced_design.scores)]
    return table


def control_rows(settings, trial_table: pd.DataFrame) -> pd.DataFrame:
    """The pilot's positive-control rows (4.6), with the baseline block of a control that has
    none of its own (marked priority): its reports are corrected by the default baseline,
    re-scored with it because the reports are the control's continuations."""
    blocks = set(settings.positive_controls.pilot_blocks)
    blocks |= {b for b in (baseline_block_for(settings, name) for name in blocks) if b}
    return trial_table[trial_table["block"].isin(blocks)]
