"""D6 masking, the other side: the unmasking step and the scoring lock.

Everything up to the fitted posterior runs on condition codes; only this step joins the
assignment key, and it refuses to run until scoring is locked for the configuration: every
registered depth partition scored, from the frozen bank and settings.
"""

from __future__ import annotations

import pandas as pd

from fear_assets.core.errors import FreezeError


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
