"""The estimands table's rules that the analysis applies and the reading reads (protocol 6.1-6.3):
estimation-only declarations, H4's row, the flags every estimand carries, and which
non-converged rows can stop the reading."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fear_assets.core.numbers import MISSING, interval, is_missing, number, yes_no
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


# ---------------------------------------------------------------------------------------
# The estimands as a researcher reads them: one label per row, the same in every table and
# figure (the posteriors metadata, the forest plot, the Stage 2 report, its CSV and JSON).
# ---------------------------------------------------------------------------------------
#: How a label whose fit missed the convergence rule (6.1) reads, wherever it is shown.
NOT_CONVERGED_TEXT = "not converged — not to be read"
#: The frequentist row's note when its label differs from the Bayesian one (6.2: reported,
#: never applied); the view carries it into the row's label as read.
DISAGREES_NOTE = "DISAGREES (reported, not applied)"
DISAGREES_TEXT = "disagrees with the Bayesian label: reported, not applied"
#: What the ``exclusions`` row's number is (4.8): the largest per-cell rate, not a mean.
WORST_CELL_RATE = "worst cell exclusion rate"
#: The view's columns, in order.
VIEW_COLUMNS = ("contrast", "kind", "status", "estimate", "interval", "estimate is", "label as read", "converged",
                "R-hat", "bulk ESS", "tail ESS", "divergences", "note")


def _text(value: object) -> str:
    return "" if is_missing(value) else str(value)


def _flag(value: object, default: bool = True) -> bool:
    return default if is_missing(value) else bool(value)


def label_as_read(row: Mapping[str, Any]) -> str:
    """The one label a row reads as, wherever it is shown: its status where it was not
    estimated ("not scored", "descriptive"), "not converged — not to be read" where its fit
    missed the convergence rule (6.1: never the label the HDI would give), else its label,
    with the frequentist disagreement note (6.2) where its note has one."""
    status = _text(row.get("status")) or "estimated"
    if status != "estimated":
        return status.replace("_", " ")
    if not _flag(row.get("converged")):
        return NOT_CONVERGED_TEXT
    text = _text(row.get("label")).replace("_", " ")
    if DISAGREES_NOTE in _text(row.get("note")):
        text = f"{text} ({DISAGREES_TEXT})" if text else DISAGREES_TEXT
    return text


def estimate_is(row: Mapping[str, Any]) -> str:
    """What a row's number is: a posterior mean, a mixed-model estimate, the worst cell's
    exclusion rate (4.8), a descriptive figure; empty where there is none."""
    status, contrast = _text(row.get("status")), _text(row.get("contrast"))
    if contrast == "exclusions":
        return WORST_CELL_RATE
    if status not in ("estimated", "descriptive"):
        return ""
    if contrast.startswith("frequentist_"):
        return "mixed-model estimate (Wald interval)"
    if status == "descriptive":
        return "descriptive estimate"
    return "posterior mean (HDI)"


def estimand_view(posteriors: pd.DataFrame, kinds: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The estimands table as a researcher reads it: one row per estimand (of ``kinds`` if
    given), every number written by ``core.numbers`` (one precision per quantity, ESS whole),
    converged as yes/no (n/a where nothing was fitted), what each number is (the exclusions
    row is the worst cell's rate, not a mean) and the label as read (:func:`label_as_read`)."""
    rows = []
    table = with_converged(posteriors if kinds is None else posteriors[posteriors["kind"].isin(kinds)])
    for row in table.to_dict("records"):
        estimated = _text(row.get("status")) == "estimated"
        quantity = "rate" if row.get("contrast") == "exclusions" else "estimate"
        low, high = row.get("hdi_low"), row.get("hdi_high")
        rows.append({
            "contrast": _text(row.get("contrast")), "kind": _text(row.get("kind")),
            "status": _text(row.get("status")).replace("_", " "),
            "estimate": number(row.get("mean"), quantity),
            "interval": MISSING if is_missing(low) and is_missing(high) else interval(low, high, quantity),
            "estimate is": estimate_is(row), "label as read": label_as_read(row),
            "converged": yes_no(_flag(row.get("converged"))) if estimated else MISSING,
            "R-hat": number(row.get("rhat"), "rhat"), "bulk ESS": number(row.get("ess_bulk"), "ess"),
            "tail ESS": number(row.get("ess_tail"), "ess"),
            "divergences": number(row.get("divergences"), "count") if estimated else MISSING,
            "note": "; ".join(p for p in (_text(row.get("convergence_problems")), _text(row.get("note"))) if p),
        })
    return pd.DataFrame(rows, columns=list(VIEW_COLUMNS))


def estimand_records(posteriors: pd.DataFrame, kinds: tuple[str, ...] | None = None) -> list[dict]:
    """The same rows as :func:`estimand_view` with raw numbers (NaN as None) beside the
    formatted ones, for the report's JSON: the labels are the view's."""
    view = estimand_view(posteriors, kinds)
    table = posteriors if kinds is None else posteriors[posteriors["kind"].isin(kinds)]
    raw = ("mean", "hdi_low", "hdi_high", "rhat", "ess_bulk", "ess_tail", "divergences")
    out = []
    for shown, row in zip(view.to_dict("records"), table.to_dict("records")):
        numbers = {k: None if is_missing(row.get(k)) else float(row[k]) for k in raw}
        out.append({**shown, "raw": numbers})
    return out


def with_converged(posteriors: pd.DataFrame) -> pd.DataFrame:
    """``posteriors`` with its ``converged`` column (a row converged where its convergence
    problems are empty), as the analysis stores it; kept where already there."""
    if "converged" in posteriors.columns:
        return posteriors
    if "convergence_problems" not in posteriors.columns:
        return posteriors.assign(converged=True)
    return posteriors.assign(converged=posteriors["convergence_problems"].fillna("") == "")


def h4_view(h4_posterior: pd.DataFrame) -> pd.DataFrame:
    """``h4_posterior``'s rows as the estimands view writes them (the same label as read as
    H4's row among the estimands and in the forest plot), with the frame set first."""
    rows = with_converged(pd.DataFrame([h4_estimand_row(r) for r in h4_posterior.to_dict("records")]))
    view = estimand_view(rows)
    view.insert(0, "frame set", list(h4_posterior["frame_set"].astype(str)))
    return view
