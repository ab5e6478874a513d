"""Zero-preference check of the forced-choice questions (protocol 4.3).

With no document, the model is asked every forced-choice question, for agent sentences and
neutral partners alike. For every question the probability of content option 1 must lie
within the registered bounds (0.4-0.6, inclusive); otherwise "the content slot is rewritten"
(4.3): the frame keeps its place in the selection and the item is reported for rewriting
(:func:`content_slot_rewrites`), as a fear short of frames is reported for writing. It is
never replaced from the reserve pool: 4.3 replaces frames only for matching and binding.

Only the two choice letters are compared (a two-way softmax), so the probability does not
depend on how much mass the model puts on other tokens. Because the options are listed in
both orders, the probability is mapped back to content option 1 before the bounds are read:
a pure letter bias then shows up as one order failing high and the other low.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.trials import candidate_frames
from fear_assets.pilot.questions import Answerer, zero_preference_questions
from fear_assets.stimuli.bank import Bank

INPUT_COLUMNS = ("item_id", "fear", "frame_set", "kind", "agent", "content", "rotation", "first_listed",
                 "logprob_a", "logprob_b")
KINDS = ("agent", "partner")
FAILURE_COLUMNS = ["item_id", "fear", "frame_set", "n_questions", "n_failed", "worst_p_option1",
                   "failed_kinds"]
# A two-way softmax of exactly 0.4 comes back as 0.39999999999999997; bounds are read with
# this slack, which is far below any probability the protocol distinguishes.
_FLOAT_SLACK = 1e-9


def option_probability(logprob_a: float, logprob_b: float) -> float:
    """Probability of the first-listed option (letter A) from the two letters' log-probabilities:
    exp(a) / (exp(a) + exp(b)), computed stably as the logistic of a - b."""
    for name, value in (("logprob_a", logprob_a), ("logprob_b", logprob_b)):
        if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(value):
            raise FearAssetsError(f"{name} must be a finite log-probability, got {value!r}; "
                                  "pass the model's log-probability of the choice letter")
    diff = float(logprob_a) - float(logprob_b)
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    e = math.exp(diff)
    return e / (1.0 + e)


def within(p: pd.Series | float, low: float, high: float) -> pd.Series | bool:
    """Inclusive bounds low <= p <= high (with float slack, so exactly 0.4 and 0.6 pass)."""
    if not low <= high:
        raise FearAssetsError(f"zero_preference bounds out of order: low {low} > high {high}; "
                              "pass the registered zero_preference.low and zero_preference.high")
    return (p >= low - _FLOAT_SLACK) & (p <= high + _FLOAT_SLACK)


def _check_rows(rows: pd.DataFrame) -> None:
    missing = [c for c in INPUT_COLUMNS if c not in rows.columns]
    if missing:
        raise FearAssetsError(f"zero-preference rows lack the column(s) {missing}; "
                              f"give one row per forced-choice question with {list(INPUT_COLUMNS)}")
    bad_kind = sorted(set(rows["kind"]) - set(KINDS))
    if bad_kind:
        raise FearAssetsError(f"column 'kind' has {bad_kind}; use 'agent' for agent sentences "
                              "and 'partner' for neutral partners")
    bad_first = rows[~rows["first_listed"].isin([1, 2])]
    if len(bad_first):
        raise FearAssetsError(f"column 'first_listed' must be 1 or 2 (the content option listed as A), "
                              f"got {sorted(set(bad_first['first_listed']), key=str)} for item(s) "
                              f"{sorted(set(bad_first['item_id']))}")


def zero_preference_table(rows: pd.DataFrame, low: float, high: float) -> pd.DataFrame:
    """One row per forced-choice question, adding p_first (probability of the option listed
    first), p_option1 (probability of content option 1, whatever the listing order) and
    passes (low <= p_option1 <= high, inclusive)."""
    _check_rows(rows)
    out = rows.copy()
    out["p_first"] = [option_probability(a, b) for a, b in zip(out["logprob_a"], out["logprob_b"])]
    out["p_option1"] = np.where(out["first_listed"] == 1, out["p_first"], 1.0 - out["p_first"])
    out["passes"] = within(out["p_option1"], low, high).astype(bool)
    return out


def zero_preference_failures(table: pd.DataFrame) -> pd.DataFrame:
    """One row per item with at least one failing question: how many of its questions were
    asked and failed, the failing p_option1 farthest from 0.5, and which kinds failed
    (agent question, partner question or both), so the writer knows what to rewrite."""
    if "passes" not in table.columns or "p_option1" not in table.columns:
        raise FearAssetsError("the table lacks 'passes'/'p_option1'; build it with zero_preference_table")
    rows = []
    for (item_id, fear, frame_set), part in table.groupby(["item_id", "fear", "frame_set"], sort=True):
        failed = part[~part["passes"].astype(bool)]
        if failed.empty:
            continue
        worst = failed.loc[(failed["p_option1"] - 0.5).abs().idxmax(), "p_option1"]
        rows.append({"item_id": item_id, "fear": fear, "frame_set": frame_set, "n_questions": len(part),
                     "n_failed": len(failed), "worst_p_option1": float(worst),
                     "failed_kinds": ", ".join(k for k in KINDS if k in set(failed["kind"]))})
    return pd.DataFrame(rows, columns=FAILURE_COLUMNS)


def zero_preference_verdict(table: pd.DataFrame, low: float, high: float) -> tuple[bool, str]:
    """Passed when every question's p_option1 lies within [low, high]; the message lists the
    failing items and what to do with them. The bounds are re-applied here, so the verdict
    always matches its arguments."""
    if "p_option1" not in table.columns:
        raise FearAssetsError("the table lacks 'p_option1'; build it with zero_preference_table")
    if table.empty:
        return False, ("zero preference (4.3): no forced-choice questions were scored; ask every "
                       "agent and partner question with no document before reading the check")
    checked = table.assign(passes=within(table["p_option1"], low, high).astype(bool))
    bounds = f"[{low:.2f}, {high:.2f}]"
    failures = zero_preference_failures(checked)
    if failures.empty:
        return True, (f"zero preference (4.3): all {len(checked)} forced-choice questions of "
                      f"{checked['item_id'].nunique()} items have option probabilities within {bounds}")
    listed = "; ".join(f"{r.item_id} ({r.failed_kinds}: {r.n_failed}/{r.n_questions} questions, "
                       f"worst p = {r.worst_p_option1:.3f})" for r in failures.itertuples())
    return False, (f"zero preference (4.3): {int((~checked['passes']).sum())} of {len(checked)} questions "
                   f"outside {bounds} in {len(failures)} item(s): {listed}. Fix: rewrite the forced-choice "
                   "question or content options of the listed items (the agent question for 'agent' "
                   "failures, the partner question for 'partner' failures), i.e. rewrite the content slot "
                   "(4.3), and rerun the check; the frame keeps its place (a zero-preference failure is not "
                   "replaced from the reserve pool)")


def content_slot_rewrites(table: pd.DataFrame, frames: Sequence[str]) -> pd.DataFrame:
    """4.3 "otherwise the content slot is rewritten": the failing items among ``frames`` (the
    final confirmatory selection), one row each as :func:`zero_preference_failures` gives it,
    with ``rewrite`` saying which content slot (the agent sentence's, the neutral partner's,
    or both). Items outside the selection are not collected and need no rewrite."""
    failures = zero_preference_failures(table)
    failures = failures[failures["item_id"].isin(list(frames))].reset_index(drop=True)
    slots = {"agent": "the agent sentence's content slot", "partner": "the neutral partner's content slot"}
    return failures.assign(rewrite=[" and ".join(slots[k] for k in kinds.split(", "))
                                    for kinds in failures["failed_kinds"]])


def rewrite_message(rewrites: pd.DataFrame) -> str:
    """The items to rewrite before registration, as the frame-writing shortfall is stated."""
    return "; ".join(f"rewrite the content slot of {r.item_id} ({r.rewrite}: {r.n_failed}/{r.n_questions} questions "
                     f"outside the band, worst p = {r.worst_p_option1:.3f})" for r in rewrites.itertuples())


@dataclass(frozen=True)
class ZeroPreferenceResult:
    """One row per item (listing orders averaged), the per-listing rows and the verdict (4.3)."""

    table: pd.DataFrame
    per_listing: pd.DataFrame
    passed: bool
    message: str
    failures: pd.DataFrame


def zero_preference(builder: DocumentBuilder, bank: Bank, view: Registered, answer: Answerer,
                    log: Callable[[str], None]) -> ZeroPreferenceResult:
    """Zero preference (4.3) of every candidate frame's forced-choice questions with no
    document: option 1's probability averaged over the two listing orders, within the
    registered band."""
    questions = zero_preference_questions(builder, [bank.item(i) for i in
                                                    candidate_frames(view.settings, bank, view.family)])
    started = time.perf_counter()
    lps = answer(questions, ["A", "B"])
    log(f"zero preference: {len(questions)} questions in {time.perf_counter() - started:.1f} s")
    band = view.settings.zero_preference
    per_listing = zero_preference_table(
        questions.drop(columns=["prefix", "body"]).assign(logprob_a=[x[0] for x in lps], logprob_b=[x[1] for x in lps]),
        band.low, band.high)
    keys = ["item_id", "fear", "frame_set", "kind", "agent", "content", "rotation"]
    table = per_listing.groupby(keys, as_index=False, sort=False).agg(
        p_option1=("p_option1", "mean"), p_option1_listed_first=("p_first", "mean"))
    table["passes"] = within(table["p_option1"], band.low, band.high).astype(bool)
    passed, message = zero_preference_verdict(table, band.low, band.high)
    table = table.assign(family=view.family.key, gate_passed=passed, message=message)
    return ZeroPreferenceResult(table, per_listing, passed, message, zero_preference_failures(table))


def zero_preference_description(settings: ProtocolSettings) -> str:
    """The zero-preference check's description, with the registered band (4.3)."""
    band = settings.zero_preference
    return ("Protocol 4.3 zero preference: with no document, every forced-choice question's option "
            f"probabilities lie within the registered band ({band.low:g}-{band.high:g}), for agent sentences "
            "and partners.")
