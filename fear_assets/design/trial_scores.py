"""One immutable row per trial from the scoring loop's output (protocol 4.5, Appendix B).

Report score of an item = mean over its report forms of the mean per-token log-probability
in the document, minus the same in the distractor-only baseline; Delta = agent item's report
score - neutral partner's. Also the summed log-probability Delta, the first-person Delta
(self cells) and the recall Delta; forced-choice probabilities with ties to the first-listed
option; the greedy answer and its truncation flag; attention mass; the feature row.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from fear_assets.design.requests import FORMS, JUDGE_FORMS, SIDES

TRIAL_KEYS = ["trial_id", "family", "depth", "block", "block_kind", "reader", "condition_code", "item_id", "fear",
              "unit_id", "baseline_unit_id", "rotation", "order", "content_option", "fc_first_listed",
              "document_sha256"]


def _value(record: dict, key: str, default):
    """A readout field, or ``default`` where the document had none (missing or NaN)."""
    value = record.get(key)
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _pivot(long: pd.DataFrame) -> dict[str, dict[str, tuple[float, float, int]]]:
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for r in long.itertuples(index=False):
        out.setdefault(r.request, {})[f"{r.branch}:{r.label}"] = (r.mean_logprob, r.sum_logprob, r.n_tokens)
    return out


def _nonfinite(long: pd.DataFrame, readouts: pd.DataFrame) -> dict[str, list[str]]:
    """request -> what it read that is not a finite number (NaN or infinite log-probabilities,
    e.g. a half-precision overflow): such a trial has no measurement, so it is flagged
    ``nonfinite_logprob`` with the reason, counted, and kept out of every model (issue 16)."""
    bad: dict[str, list[str]] = {}
    if len(long):
        values = long[["mean_logprob", "sum_logprob"]].to_numpy(dtype=float)
        for r, ok in zip(long.itertuples(index=False), np.isfinite(values).all(axis=1)):
            if not ok:
                bad.setdefault(r.request, []).append(f"{r.branch}:{r.label} = {r.mean_logprob}")
    for r in readouts.to_dict("records"):
        for key, value in r.items():
            if key.endswith("_choice_logprobs") and isinstance(value, str) and value:
                lps = json.loads(value)
                if lps and not all(math.isfinite(x) for x in lps):
                    bad.setdefault(r["request"], []).append(f"{key} = {lps}")
    return bad


def assemble(table: pd.DataFrame, long: pd.DataFrame, readouts: pd.DataFrame) -> pd.DataFrame:
    """Wide per-trial scores for every trial of ``table`` that was requested."""
    scores = _pivot(long) if len(long) else {}
    nonfinite = _nonfinite(long, readouts)
    ro = {r["request"]: r for r in readouts.to_dict("records")}
    baseline_request = {row["unit_id"]: row["trial_id"] for row in table.to_dict("records")
                        if row["block_kind"] == "baseline"}
    out = []
    for row in table.to_dict("records"):
        tid = row["trial_id"]
        if tid not in ro:
            continue
        r = ro[tid]
        rec = {k: row[k] for k in TRIAL_KEYS}
        rec.update({"n_tokens": int(r["n_tokens"]), "excluded_context": bool(r["excluded_context"]),
                    "exclusion_reason": r["exclusion_reason"] or "",
                    "generated_text": _value(r, "generated_text", None),
                    "generation_truncated": bool(_value(r, "generation_truncated", False)),
                    "answer_exceeds_context": bool(_value(r, "answer_exceeds_context", False)),
                    "attention_agent": _value(r, "attention_agent", math.nan),
                    "attention_partner": _value(r, "attention_partner", math.nan),
                    "feature_row": int(_value(r, "feature_row", -1))})
        bad = nonfinite.get(tid, []) + [f"baseline {x}" for x in nonfinite.get(
            baseline_request.get(row["baseline_unit_id"], ""), [])]
        rec["nonfinite_logprob"] = bool(bad)
        if bad:
            rec["exclusion_reason"] = "; ".join(filter(None, [rec["exclusion_reason"],
                                                              "non-finite log-probability: " + ", ".join(bad)]))
        own = scores.get(tid, {})
        conts = json.loads(row["continuations"]) if row["continuations"] else {}
        base = scores.get(baseline_request.get(row["baseline_unit_id"], ""), {})
        forms = JUDGE_FORMS if row["reader"] == "judge" else FORMS
        for side in SIDES:
            for form in forms:
                key = f"report:{side}_{form}"
                doc = own.get(key)
                text = conts.get(side, {}).get(form)
                bas = base.get(f"report:{text}") if text else None
                rec[f"{side}_{form}_mean"] = doc[0] if doc else math.nan
                rec[f"{side}_{form}_sum"] = doc[1] if doc else math.nan
                rec[f"{side}_{form}_ntok"] = doc[2] if doc else 0
                rec[f"base_{side}_{form}_mean"] = bas[0] if bas else math.nan
                rec[f"base_{side}_{form}_sum"] = bas[1] if bas else math.nan
            doc = own.get(f"recall:{side}_recall")
            text = conts.get(side, {}).get("quotation")
            bas = base.get(f"recall:{text}") if text else None
            rec[f"{side}_recall_mean"] = doc[0] if doc else math.nan
            rec[f"base_{side}_recall_mean"] = bas[0] if bas else math.nan
        primary_forms = [f for f in ("name", "role", "quotation") if f in forms]

        def report_score(side: str, stat: str, which=primary_forms) -> float:
            vals = [rec[f"{side}_{f}_{stat}"] - rec[f"base_{side}_{f}_{stat}"] for f in which]
            return float(np.mean(vals)) if vals else math.nan

        rec["report_score_agent"] = report_score("agent", "mean")
        rec["report_score_partner"] = report_score("partner", "mean")
        rec["delta"] = rec["report_score_agent"] - rec["report_score_partner"]
        rec["delta_sum"] = report_score("agent", "sum") - report_score("partner", "sum")
        rec["delta_first_person"] = (report_score("agent", "mean", ["first_person"]) - rec["report_score_partner"]
                                     if "agent_first_person_mean" in rec else math.nan)
        rec["delta_recall"] = ((rec["agent_recall_mean"] - rec["base_agent_recall_mean"])
                               - (rec["partner_recall_mean"] - rec["base_partner_recall_mean"]))
        fc = json.loads(_value(r, "forced_choice_choice_logprobs", "null"))
        if fc and all(math.isfinite(x) for x in fc):
            first = int(row["fc_first_listed"])
            la, lb = fc  # A = first-listed option
            p_first = 1.0 / (1.0 + math.exp(lb - la))
            p1 = p_first if first == 1 else 1.0 - p_first
            choice = first if la >= lb else 3 - first  # ties go to the first-listed option
            rec.update({"p_option1": p1, "fc_choice": choice,
                        "fc_correct": (choice == int(row["content_option"])) if row["content_option"] else None})
        else:
            rec.update({"p_option1": math.nan, "fc_choice": 0, "fc_correct": None})
        rec["choice_logprobs"] = _value(r, "report_choice_logprobs", "")
        out.append(rec)
    frame = pd.DataFrame(out)
    if "fc_correct" in frame:
        frame["fc_correct"] = frame["fc_correct"].astype("boolean")
    return frame
