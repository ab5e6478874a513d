"""Trial exclusions and flagged design cells (protocol 4.8).

"A trial is excluded only if the document exceeds the context window after tokenisation,
or a generated answer is truncated by the length limit. [...] If exclusions exceed 5% of
any design cell, that cell is flagged and a sensitivity analysis without it is reported."

So the two scoring flags are the only reasons (nothing else removes a trial), the rule
is strictly "exceed" (a cell at exactly the rate is not flagged), and flagging never
changes the primary analysis: ``without_flagged_cells`` builds the data of the reported
sensitivity analysis only. The rate comes in as an argument (settings
``exclusion.cell_flag_rate``).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

REASONS = ("excluded_context", "generation_truncated")
CELL_COLUMNS = ("block", "agent", "content", "depth")
#: Recorded per trial but not a reason for exclusion (4.8 names only REASONS): an answer that
#: cannot fit in the window after a document that does. Counted per cell where scores carry it.
RECORDED = ("answer_exceeds_context",)
#: Not a 4.8 exclusion either: a trial whose log-probabilities are not finite numbers (NaN,
#: infinite) has no measurement. It is flagged by the scoring stage, counted per cell here
#: and kept out of every model (``data.kept``), never dropped without a count (issue 16).
UNMEASURED = ("nonfinite_logprob",)
RATE_COLUMNS = ("trials", "excluded", "excluded_context", "generation_truncated", "answer_exceeds_context",
                "nonfinite_logprob", "rate", "flagged")


def excluded(scores: pd.DataFrame) -> pd.Series:
    """True where a trial is excluded under 4.8: either registered reason, nothing else.
    A missing flag is an error, not a pass: an unscored trial must not count as kept."""
    missing = [c for c in REASONS if c not in scores.columns]
    if missing:
        raise ValueError(f"scores lack the exclusion flag column(s) {missing}; the scoring stage writes "
                         f"{list(REASONS)} per trial (protocol 4.8)")
    flags = []
    for column in REASONS:
        values = scores[column]
        if values.isna().any():
            rows = list(values.index[values.isna()][:5])
            raise ValueError(f"scores column {column!r} is missing on rows {rows}; every trial needs both flags "
                             "(re-materialise those trials' scores)")
        if not set(pd.unique(values)) <= {True, False}:
            bad = sorted(map(repr, set(pd.unique(values)) - {True, False}))[:5]
            raise ValueError(f"scores column {column!r} holds {bad}; it must be boolean (True/False)")
        flags.append(values.astype(bool))
    return flags[0] | flags[1]


def exclusion_rates(scores: pd.DataFrame, cell_columns: Sequence[str] = CELL_COLUMNS, *,
                    flag_rate: float) -> pd.DataFrame:
    """Per design cell: trials, excluded, each reason's count (``excluded_context``,
    ``generation_truncated``; a trial with both counts under both, and once in ``excluded``),
    rate = excluded / trials, flagged = rate > flag_rate.

    Cells are the distinct combinations of ``cell_columns``; a missing value (a baseline's
    agent, say) is its own cell rather than a dropped row. Comparing the exact quotient
    with the rate is safe: k/n is correctly rounded, so a cell at exactly the rate (1 in
    20 at 5%) compares equal and is not flagged."""
    if not 0.0 <= flag_rate < 1.0:
        raise ValueError(f"flag_rate must lie in [0, 1), got {flag_rate}; pass settings exclusion.cell_flag_rate")
    cell_columns = list(cell_columns)
    missing = [c for c in cell_columns if c not in scores.columns]
    if missing:
        raise ValueError(f"scores lack the cell column(s) {missing}; pass cell_columns that the scores carry "
                         f"(they have {list(scores.columns)})")
    if scores.empty:
        raise ValueError("scores are empty: there is nothing to rate; materialise the scores first")
    counted = (*REASONS, *[c for c in (*RECORDED, *UNMEASURED) if c in scores.columns])
    flags = scores[cell_columns].assign(_excluded=excluded(scores).astype(int),
                                        **{f"_{r}": scores[r].fillna(False).astype(bool).astype(int) for r in counted})
    grouped = flags.groupby(cell_columns, dropna=False, sort=True)
    out = pd.DataFrame({"trials": grouped.size(), "excluded": grouped["_excluded"].sum(),
                        **{r: grouped[f"_{r}"].sum() for r in counted}}).reset_index()
    for column in ("trials", "excluded", *counted):
        out[column] = out[column].astype(int)
    out["rate"] = out["excluded"] / out["trials"]
    out["flagged"] = out["rate"] > flag_rate
    return out[[*cell_columns, *[c for c in RATE_COLUMNS if c in out.columns]]]


def without_flagged_cells(data: pd.DataFrame, rates: pd.DataFrame) -> pd.DataFrame:
    """The sensitivity data set of 4.8: ``data`` less every row in a flagged cell. The
    primary analysis is never run on this; it is the one reported beside it."""
    missing_rate = [c for c in RATE_COLUMNS if c not in rates.columns and c not in (*RECORDED, *UNMEASURED)]
    if missing_rate:
        raise ValueError(f"rates lack {missing_rate}; pass the output of exclusion_rates")
    cell_columns = [c for c in rates.columns if c not in RATE_COLUMNS]
    if not cell_columns:
        raise ValueError("rates name no cell columns; pass the output of exclusion_rates")
    missing = [c for c in cell_columns if c not in data.columns]
    if missing:
        raise ValueError(f"data lack the cell column(s) {missing} that the rates were computed over; add them "
                         "or compute the rates over the columns the data carry")
    flagged = rates.loc[rates["flagged"].astype(bool), cell_columns].drop_duplicates()
    if flagged.empty:
        return data.copy()
    marked = data.merge(flagged.assign(_flagged=True), on=cell_columns, how="left")
    keep = marked["_flagged"].isna().to_numpy()
    return data.loc[keep].copy()
