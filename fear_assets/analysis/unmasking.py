"""D6 masking, the other side: the unmasking step and the scoring lock.

Everything up to the fitted posterior runs on condition codes; only this step joins the
assignment key, and it refuses to run until scoring is locked for the configuration: every
registered depth partition scored, from the frozen bank and settings.
"""

from __future__ import annotations

import pandas as pd

from fear_assets.core.errors import FreezeError
from fear_assets.design.unmasking import _join_codes


def scoring_lock(registered_depths: list[str], scores: pd.DataFrame, frozen: dict) -> list[str]:
    """Reasons the configuration's scoring is not locked (empty: locked)."""
    reasons = []
    missing = sorted(set(registered_depths) - set(scores["depth"]))
    if missing:
        reasons.append(f"depth partitions not scored: {', '.join(missing)}")
    for column, key in (("settings_sha256", "settings_sha256"), ("bank_sha256", "bank_sha256")):
        stale = set(scores[column]) - {frozen.get(key)}
        if stale:
            reasons.append(f"scores built from {column} {sorted(s[:12] for s in stale)} instead of the frozen "
                           f"{str(frozen.get(key))[:12]}")
    return reasons


def unmask(table: pd.DataFrame, key: pd.DataFrame, registered_depths: list[str], scores: pd.DataFrame,
           frozen: dict) -> pd.DataFrame:
    """Join agent, content and cell to a masked table; refuses while scoring is unlocked."""
    reasons = scoring_lock(registered_depths, scores, frozen)
    if reasons:
        raise FreezeError("unmasking refused, scoring is not locked: " + "; ".join(reasons) +
                          ". Materialise every depth partition of scores from the frozen inputs first.")
    return _join_codes(table, key)
