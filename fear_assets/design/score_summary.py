"""A scored partition as a researcher reads it: per block, what scored it and its mean Delta.

Only blocks scored by the canonical reports carry a Delta (4.5): the probe blocks are read by
their residual-stream features, the content-removed blocks by forced choice, the binding
block by its answer choices and the distractor-only baselines are the reference every Delta
subtracts. Their mean Delta is therefore not a number but "n/a (block scored by ...)".
Presentation only (every number through ``core.numbers``); the scores are ``trial_scores``'.
"""

from __future__ import annotations

import pandas as pd

from fear_assets.core.numbers import MISSING, number

BASELINE = "distractor-only baseline"
#: (column, what it means) for each readout a scored row can carry, in the order they are named.
READOUTS = (("delta", "reports (Delta)"), ("delta_recall", "recall"), ("p_option1", "forced choice"))


def _present(rows: pd.DataFrame, column: str) -> bool:
    return column in rows and bool(rows[column].notna().any())


def scored_by(rows: pd.DataFrame) -> str:
    """What scored one block's rows: the readouts they carry."""
    if "block_kind" in rows and len(rows) and (rows["block_kind"] == "baseline").all():
        return BASELINE
    said = [name for column, name in READOUTS if _present(rows, column)]
    if "feature_row" in rows and bool((rows["feature_row"] >= 0).any()):
        said.append("residual-stream features (the probe)")
    if not said and "choice_logprobs" in rows and bool((rows["choice_logprobs"].fillna("") != "").any()):
        said.append("answer choices")
    return ", ".join(said) or "no readout"


def _mean(rows: pd.DataFrame, column: str, by: str) -> str:
    if not _present(rows, column):
        return (f"{MISSING} (the baseline every Delta subtracts)" if by == BASELINE
                else f"{MISSING} (block scored by {by})")
    return number(rows[column].mean(), "estimate")


def block_summary(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per block: trials, what scored it, mean Delta and mean recall Delta (masked
    cells pooled), as text."""
    out = []
    for block, rows in scores.groupby("block", sort=True):
        by = scored_by(rows)
        out.append({"block": str(block), "trials": number(len(rows), "count"), "scored by": by,
                    "mean Delta": _mean(rows, "delta", by), "mean recall Delta": _mean(rows, "delta_recall", by)})
    return pd.DataFrame(out, columns=["block", "trials", "scored by", "mean Delta", "mean recall Delta"])


def resume_summary(progress_by_reader: dict[str, dict]) -> pd.DataFrame:
    """The resumable scoring's progress, one row per reader (counts whole, rates by quantity)."""
    quantities = {"documents/s": "rate", "ETA s": "seconds"}
    rows = [{"reader": reader, **{k: number(v, quantities.get(k, "count")) for k, v in progress.items()}}
            for reader, progress in progress_by_reader.items()]
    return pd.DataFrame(rows)
