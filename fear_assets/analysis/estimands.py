"""The estimands table's rules that the analysis applies and the reading reads (protocol 6.1-6.3):
estimation-only declarations, H4's row, the flags every estimand carries, and which
non-converged rows can stop the reading."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fear_assets.models.decision import ESTIMATION_ONLY

#: Estimands that can change the reading (6.2: H1-H5 are judged by the rule, the gates and
#: the controls decide rows 1 and 7-12). Secondary and sensitivity rows "cannot change the
#: reading" (4.5, 5), so their convergence is reported, never a reason to stop.
READING_KINDS = ("confirmatory", "gate", "control")
#: 6.2: "H1, H3 and H4 ... do not change the Section 8 reading". H4's own rules in 6.1
#: (uninterpretable, estimation-only) are flags on its row, and so is its convergence.
NOT_READING_CONTRASTS = ("H4",)


def apply_estimation_only(posteriors: pd.DataFrame, declared: Mapping[str, str]) -> pd.DataFrame:
    """Each declared hypothesis keeps its estimate and interval but is labelled
    ``estimation_only`` (not practically meaningful), with the declaration in its note: the
    decision rule is not applied to it, so no later step can read it as Supported."""
    out = posteriors.copy()
    hit = out["contrast"].isin(list(declared)) & (out["kind"] == "confirmatory") & (out["status"] == "estimated")
    out.loc[hit, "label"] = ESTIMATION_ONLY
    out.loc[hit, "practically_meaningful"] = False
    if "note" in out:
        out.loc[hit, "note"] = [f"estimation-only, declared before collection: {declared[c]}; {n}"
                                for c, n in zip(out.loc[hit, "contrast"], out.loc[hit, "note"].fillna(""))]
    return out


def convergence_split(posteriors: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Estimated rows that miss the convergence rule (6.1), split into those that can stop
    the reading (H1-H3, H5, gates, controls: their labels must not be read) and the rest:
    H4 (6.2: it never changes the reading), secondary and sensitivity rows (flagged,
    reported, never a reason to stop)."""
    estimated = posteriors[posteriors["status"] == "estimated"]
    bad = estimated[estimated["convergence_problems"].fillna("") != ""]
    reading = bad["kind"].isin(READING_KINDS) & ~bad["contrast"].isin(NOT_READING_CONTRASTS)
    return bad[reading], bad[~reading]


def h4_estimand_row(h4: Mapping[str, Any]) -> dict:
    """H4's row among the estimands (6.1), from the ``h4_posterior`` table's row: its label
    is not read where the fit did not converge."""
    return {"contrast": "H4", "kind": "confirmatory", "status": "estimated", "scale": "probe log-odds",
            "mean": h4["mean"], "hdi_low": h4["hdi_low"], "hdi_high": h4["hdi_high"], "label": h4["label"],
            "practically_meaningful": bool(h4["practically_meaningful"]), "rhat": h4["max_rhat"],
            "ess_bulk": h4["min_ess_bulk"], "ess_tail": h4["min_ess_tail"], "divergences": h4["divergences"],
            "note": f"from h4_posterior: {h4['flags']}",
            "convergence_problems": "see h4_posterior" if "NOT CONVERGED" in str(h4["flags"]) else ""}


def estimand_flags(record: Mapping[str, Any], pilot_only: bool, stand_in: str | None,
                   pilot_note: str) -> list[str]:
    """What every estimand of a configuration carries: the failed registration gates, pilot
    frames only (descriptive), stand-in scorer or judge."""
    flags = list(record["failed_gates"])
    if pilot_only:
        flags.append(pilot_note)
    if stand_in:
        flags.append("stand-in scorer/judge")
    return flags
