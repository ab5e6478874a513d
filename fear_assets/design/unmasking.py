"""D6 unmasking's one join of the assignment key onto masked rows, and the pilot's unmasking
(the pilot gates read pilot-frame conditions before registration). The confirmatory
unmasking behind the scoring lock is ``analysis.unmasking``."""

from __future__ import annotations

import pandas as pd

from fear_assets.core.errors import FreezeError


def unmask_pilot(table: pd.DataFrame, key: pd.DataFrame) -> pd.DataFrame:
    """Conditions of pilot-frame rows only (D6): the pilot gates (binding, controls) need
    them by construction before registration, and no confirmatory row is ever unmasked here
    (those wait for the scoring lock, :func:`unmask`). A pilot row is one of a ``pilot_`` block,
    or, in a probe table (no block column), one of the pilot frame set."""
    pilot = table["block"].str.startswith("pilot_") if "block" in table else table["frame_set"].eq("pilot")
    if not pilot.all():
        raise FreezeError("pilot gates unmask pilot-frame rows only; confirmatory rows wait for the scoring lock")
    return _join_codes(table, key)


def _join_codes(table: pd.DataFrame, key: pd.DataFrame) -> pd.DataFrame:
    """The one join of the assignment key onto masked rows."""
    codes = key[["condition_code", "condition", "agent", "content", "cell_index"]].drop_duplicates()
    if codes["condition_code"].duplicated().any():
        raise FreezeError("the assignment key maps one code to two conditions: rebuild it from the frozen settings")
    return table.merge(codes, on="condition_code", how="left", validate="many_to_one")
