"""Depth band (H1-H4) and H5 depth from pilot frames only (protocol 5).

Neither rule reads any agent-by-content contrast: both pool all six cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.registered import Registered
from fear_assets.pilot.report_scoring import CATEGORIES
from fear_assets.models.data import kept
from fear_assets.core.settings import DepthBand, depth_index, depth_key

RATE_COLUMNS = ["depth_index", "answers", "refusals", "mentions", "neutral_mention_rate"]


def pooled_by_depth(pilot_scores: pd.DataFrame, report_scoring: pd.DataFrame) -> pd.DataFrame:
    """What both rules read, per depth index: the pilot's primary trials that no registered
    reason excludes (4.8: excluded trials enter no rule), their number, the pooled
    forced-choice accuracy over all six cells (the H5 depth rule) and the neutral-partner
    mention rate (the band rule, :func:`neutral_mention_rates`)."""
    primary = pilot_scores[pilot_scores["block"] == "pilot_primary"]
    if primary.empty:
        raise FearAssetsError("no pilot_primary scores for this family: materialise pilot_scores for its depths first")
    pilot = kept(primary).copy()
    if pilot.empty:  # every trial excluded (4.8): neither rule has a trial to read
        truncated = int(primary["generation_truncated"].fillna(False).astype(bool).sum())
        raise FearAssetsError(
            f"every one of the {len(primary)} pilot_primary trials is excluded under 4.8 ({truncated} greedy answers "
            "truncated at the registered answer length, the rest over the context window), so the depth band and "
            "H5 depth rules (5) have no trial to read. Fix: a checkpoint that ends its answers within the "
            "registered length (check the end-of-turn tokens of its chat template), then rescore the pilot")
    pilot["depth_index"] = pilot["depth"].map(depth_index)
    accuracy = pilot.groupby("depth_index").agg(trials=("trial_id", "size"), fc_accuracy=("fc_correct", "mean"))
    return accuracy.reset_index().merge(neutral_mention_rates(report_scoring), on="depth_index", how="left")


def neutral_mention_rates(scored: pd.DataFrame) -> pd.DataFrame:
    """Per depth, the rate at which the generated report mentions the neutral partner, as the
    band rule (5) reads it: a mention is the resolved outcome of 4.5 (keyword rule and
    blinded scorer, the stem pass where they disagree: ``category`` of
    :func:`~fear_assets.pilot.report_scoring.score_reports`), and refusals are their own
    category, counted but outside the rate (mentions / non-refusal answers). A depth whose
    every answer is a refusal has no rate (NaN). ``scored``: one row per (trial, side) with
    ``depth`` ("d<index>"), ``side`` and ``category``; only the partner side is read."""
    missing = [c for c in ("depth", "side", "category") if c not in scored.columns]
    if missing:
        raise FearAssetsError(f"scored reports lack the column(s) {missing}; pass report_scoring's table "
                              "(one row per trial and side, with its resolved category)")
    partner = scored[scored["side"] == "partner"]
    if partner.empty:
        raise FearAssetsError("no scored partner reports: materialise report_scoring for this family first")
    bad = sorted(set(partner["category"]) - set(CATEGORIES), key=str)
    if bad:
        raise FearAssetsError(f"column 'category' has {bad}; it must be one of {list(CATEGORIES)} "
                              "(score the reports with score_reports)")
    index = partner["depth"].astype(str).str.removeprefix("d")
    if not index.str.isdigit().all():
        raise FearAssetsError(f"column 'depth' has {sorted(set(partner['depth'][~index.str.isdigit()]))[:3]}; "
                              "name depths as d<index>, e.g. d3")
    grouped = partner.assign(depth_index=index.astype(int)).groupby("depth_index")["category"]
    rows = []
    for depth, categories in grouped:
        mentions, refusals = int((categories == "mention").sum()), int((categories == "refusal").sum())
        answered = len(categories) - refusals
        rows.append({"depth_index": int(depth), "answers": len(categories), "refusals": refusals,
                     "mentions": mentions, "neutral_mention_rate": mentions / answered if answered else math.nan})
    return pd.DataFrame(rows, columns=RATE_COLUMNS)


def depth_band(mention_rate: Mapping[int, float], low: float, high: float, min_depths: int,
               target: float) -> tuple[list[int], str]:
    """Depths at which the generated report mentions the neutral partner on low..high of
    trials; if fewer than ``min_depths`` qualify, the ``min_depths`` depths closest to
    ``target`` (ties to the shallower depth). Returns (depth indices, rule applied). A depth
    without a rate (NaN: every answer a refusal) can neither qualify nor be closest."""
    rated = {d: r for d, r in mention_rate.items() if r is not None and not math.isnan(r)}
    if len(rated) < min_depths:
        raise FearAssetsError(f"only {len(rated)} depth(s) have a neutral-mention rate ({sorted(rated)}); the band "
                              f"needs {min_depths}. Fix: score the pilot reports at every registered depth (a depth "
                              "whose answers are all refusals has no rate)")
    qualifying = sorted(d for d, r in rated.items() if low <= r <= high)
    if len(qualifying) >= min_depths:
        return qualifying, f"neutral-partner mention rate within [{low:.2f}, {high:.2f}]"
    closest = sorted(rated, key=lambda d: (abs(rated[d] - target), d))[:min_depths]
    return sorted(closest), (f"fallback: fewer than {min_depths} depths within [{low:.2f}, {high:.2f}]; "
                             f"the {min_depths} closest to {target:.2f}")


def h5_depth(accuracy: Mapping[int, float], low: float, high: float, target: float) -> tuple[int, str]:
    """The deepest depth whose pooled forced-choice accuracy lies in low..high; otherwise the
    depth closest to ``target`` (ties to the deeper depth)."""
    qualifying = [d for d, a in accuracy.items() if low <= a <= high]
    if qualifying:
        return max(qualifying), f"deepest depth with accuracy within [{low:.2f}, {high:.2f}]"
    best = min(accuracy, key=lambda d: (abs(accuracy[d] - target), -d))
    return best, f"fallback: no depth within [{low:.2f}, {high:.2f}]; closest to {target:.2f}"


def stored_band(pilot_depths: pd.DataFrame) -> DepthBand:
    """The depth band a ``pilot_depths`` table stores."""
    return DepthBand.parse(pilot_depths["depth_band"].iloc[0])


@dataclass(frozen=True)
class DepthBandResult:
    """The pilot's depth table (one row per depth) and the two rules' verdicts (protocol 5)."""

    table: pd.DataFrame
    band: list[int]
    band_rule: str
    h5_index: int
    h5_rule: str


def pilot_depth_band(pilot_scores: pd.DataFrame, report_scoring: pd.DataFrame, view: Registered) -> DepthBandResult:
    """The depth band (H1-H4) and the H5 depth of one family (protocol 5), from the pilot's
    kept primary trials pooled over all six cells (:func:`pooled_by_depth`)."""
    by_depth = pooled_by_depth(pilot_scores, report_scoring)
    rule, h5 = view.settings.depth_band_rule, view.settings.h5_depth_rule
    band, band_rule = depth_band(dict(zip(by_depth.depth_index, by_depth.neutral_mention_rate)),
                                 rule.neutral_mention_low, rule.neutral_mention_high, rule.min_depths,
                                 rule.fallback_target)
    h5_index, h5_rule = h5_depth(dict(zip(by_depth.depth_index, by_depth.fc_accuracy.astype(float))),
                                 h5.accuracy_low, h5.accuracy_high, h5.fallback_target)
    family = view.family
    table = by_depth.assign(
        family=family.key, depth=[depth_key(int(d)) for d in by_depth.depth_index],
        depth_tokens=[family.tokens_at(int(d)) for d in by_depth.depth_index],
        in_band=by_depth.depth_index.isin(band), is_h5_depth=by_depth.depth_index == h5_index,
        depth_band=DepthBand.of(band).stored, h5_depth=h5_index, band_rule=band_rule, h5_rule=h5_rule)
    return DepthBandResult(table, band, band_rule, h5_index, h5_rule)


def band_depth_keys(pilot_depths: pd.DataFrame) -> set[str]:
    """The stored band's depth keys: the only depths the pilot's positive controls are scored
    at (Appendix C step 2: "their contrasts are averaged over the band")."""
    return set(stored_band(pilot_depths).keys)
