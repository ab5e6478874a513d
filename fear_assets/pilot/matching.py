"""Surprisal matching of the frames (protocol 4.3), from document-independent statistics only.

A frame is retained only if, under each of the three rotations and both content options,
(a) its threat and harmless versions (for every agent) and (b) each pair of its self, peer
and person versions (for both contents) differ in mean non-name surprisal by no more than
the registered tolerance (0.10 nats/token). Across the retained bank the mean differences
must be equivalent to zero within +-0.05 by two one-sided tests (statsmodels), one mean
difference per frame. A failing
confirmatory frame is replaced by the lowest-numbered passing reserve frame of its fear;
a fear left with fewer confirmatory frames than registered is reported with how many frames
to write. Each secondary-class event is matched to the retained agent frames within the same
tolerance (:func:`event_differences` says which statistic and why). The bank-level TOST and
the event matching that the registration record reports run on the final selection, after
binding replacement (:func:`final_bank_matching`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from typing import Mapping, Sequence

import pandas as pd
from fear_assets.core.registered import Registered
from fear_assets.core.settings import AGENTS, ProtocolSettings
from fear_assets.stimuli.bank import Bank

TOST_COLUMNS = ["comparison", "n", "mean_difference", "tost_p"]


def frame_differences(surprisal: pd.DataFrame) -> pd.DataFrame:
    """Every registered difference in mean non-name NLL, one row per (frame, rotation,
    option, comparison). ``surprisal`` is the sentence_surprisal table."""
    agents = surprisal[surprisal["agent"].isin(AGENTS)]
    wide = agents.pivot_table(index=["item_id", "fear", "frame_set", "rotation", "option"],
                              columns=["agent", "content"], values="rest_nll")
    rows = []
    for key, r in wide.iterrows():
        base = dict(zip(["item_id", "fear", "frame_set", "rotation", "option"], key))
        for agent in AGENTS:
            rows.append({**base, "comparison": f"{agent}: threat - harmless",
                         "difference": r[(agent, "threat")] - r[(agent, "harmless")]})
        for a, b in combinations(AGENTS, 2):
            for content in ("threat", "harmless"):
                rows.append({**base, "comparison": f"{content}: {a} - {b}",
                             "difference": r[(a, content)] - r[(b, content)]})
    return pd.DataFrame(rows)


def frame_verdicts(differences: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per frame: the largest absolute difference and whether every one is within tolerance."""
    g = differences.assign(abs_difference=differences["difference"].abs()).groupby(
        ["item_id", "fear", "frame_set"], as_index=False)
    out = g.agg(max_abs_difference=("abs_difference", "max"), n_differences=("difference", "size"))
    out["passes"] = out["max_abs_difference"] <= tolerance
    return out


def select_frames(verdicts: pd.DataFrame, numbers: dict[str, int], required_per_fear: int,
                  rewrites: Mapping[str, str] | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """Confirmatory frames after replacement (4.3): a failing confirmatory frame is replaced
    by its registered rewrite if that passes (``rewrites``: frame id -> rewrite id), else by
    the lowest-numbered passing reserve frame of its fear. Returns (selection, shortfall by fear)."""
    v = verdicts.assign(number=verdicts["item_id"].map(numbers))
    passing = set(v.loc[v["passes"].astype(bool), "item_id"])
    rewrites = rewrites or {}
    selected, shortfall = [], {}
    for fear, part in v.groupby("fear", sort=True):
        confirmatory = part[part["frame_set"] == "confirmatory"].sort_values("number")
        reserves = list(part[(part["frame_set"] == "reserve") & part["passes"]].sort_values("number")["item_id"])
        for row in confirmatory.itertuples():
            if row.passes:
                selected.append({"fear": fear, "item_id": row.item_id, "replaces": ""})
            elif rewrites.get(row.item_id) in passing:
                selected.append({"fear": fear, "item_id": rewrites[row.item_id], "replaces": row.item_id})
            elif reserves:
                selected.append({"fear": fear, "item_id": reserves.pop(0), "replaces": row.item_id})
        have = sum(1 for s in selected if s["fear"] == fear)
        if have < required_per_fear:
            shortfall[fear] = required_per_fear - have
    return pd.DataFrame(selected, columns=["fear", "item_id", "replaces"]), shortfall


def equivalence(differences: pd.DataFrame, retained: set[str], bound: float) -> pd.DataFrame:
    """TOST per comparison type across the retained frames: H0 |mean| >= bound.

    4.3: "Across the retained bank, the mean differences must also be equivalent to zero".
    The unit is the frame: a frame's rotations, options (and, for an agent pair, its two
    contents) are repeated readings of one written frame, not independent samples, so each
    frame contributes one mean difference per comparison and the test has one observation
    per retained frame (``n`` = frames). With fewer than two frames the test is undefined
    (p is NaN) and so never passes."""
    return tost_over(per_frame_differences(differences), retained, bound)


def per_frame_differences(differences: pd.DataFrame) -> pd.DataFrame:
    """One mean difference per (comparison kind, frame): the observations of the bank-level
    TOST (:func:`equivalence`). Columns kind, item_id, difference."""
    kind = differences["comparison"].str.replace(r"^(threat|harmless): ", "", regex=True)
    per_frame = differences.assign(kind=kind).groupby(["kind", "item_id"], sort=True)["difference"].mean()
    return per_frame.reset_index()


def tost_over(per_frame: pd.DataFrame, retained: set[str], bound: float) -> pd.DataFrame:
    """The bank-level TOST over the ``retained`` frames' per-frame mean differences."""
    from statsmodels.stats.weightstats import DescrStatsW

    d = per_frame[per_frame["item_id"].isin(retained)]
    rows = []
    for comparison, part in d.groupby("kind", sort=True):
        values = part["difference"].to_numpy()
        p_value = float(DescrStatsW(values).ttost_mean(-bound, bound)[0]) if len(values) > 1 else float("nan")
        rows.append({"comparison": comparison, "n": len(values), "mean_difference": float(values.mean()),
                     "tost_p": p_value})
    return pd.DataFrame(rows, columns=TOST_COLUMNS)


# ---------------------------------------------------------------------------------------
# Secondary-class events (4.3)
# ---------------------------------------------------------------------------------------
EVENT_COLUMNS = ["item_id", "event_class", "rotation", "option", "event_nll", "frames_mean_nll", "difference"]
EVENT_VERDICT_COLUMNS = ["item_id", "event_class", "max_abs_difference", "worst_rotation", "worst_option",
                         "n_differences", "passes"]


def event_differences(surprisal: pd.DataFrame, retained: set[str], event_classes: Sequence[str]) -> pd.DataFrame:
    """4.3: each secondary-class event "is matched in document-independent surprisal to the
    agent frames within 0.10 nats per token". The protocol does not say which statistic of
    the agent frames; this reading takes, per rotation (the rotation changes only the
    system prompt, so event and frames are scored after the same one), the mean non-name
    surprisal of the retained agent frames over their three agents, two contents and two
    options: the average agent sentence the events stand beside in the analysis. An event's
    statistic is its whole sentence's mean surprisal (it has no name token), under each
    rotation and for both content options, as a frame is checked "under each of the three
    name rotations and for both content options". One row per event x rotation x option:
    event minus the frames' mean. Where no frame is retained the reference is missing and
    the difference is NaN (never within tolerance)."""
    return events_against(event_surprisal(surprisal, event_classes),
                          reference_nll(frame_nll_sums(surprisal), retained))


def event_surprisal(surprisal: pd.DataFrame, event_classes: Sequence[str]) -> pd.DataFrame:
    """The events' own statistic, one row per event x rotation x option (no reference yet)."""
    events = surprisal[surprisal["frame_set"].isin(list(event_classes)) & ~surprisal["agent"].eq("partner")]
    return pd.DataFrame({"item_id": events["item_id"], "event_class": events["frame_set"],
                         "rotation": events["rotation"], "option": events["option"],
                         "event_nll": events["rest_nll"]}).reset_index(drop=True)


def frame_nll_sums(surprisal: pd.DataFrame) -> pd.DataFrame:
    """Per agent frame and rotation, the sum and count of its sentences' non-name NLL, so the
    agent frames' mean under any retained set can be formed later (item_id, rotation, sum, n)."""
    frames = surprisal[surprisal["agent"].isin(AGENTS)]
    return frames.groupby(["item_id", "rotation"], as_index=False).agg(sum=("rest_nll", "sum"),
                                                                         n=("rest_nll", "size"))


def reference_nll(sums: pd.DataFrame, retained: set[str]) -> pd.Series:
    """Per rotation, the mean non-name NLL of the retained agent frames' sentences."""
    kept = sums[sums["item_id"].isin(retained)].groupby("rotation")[["sum", "n"]].sum()
    return kept["sum"] / kept["n"]


def events_against(events: pd.DataFrame, reference: pd.Series) -> pd.DataFrame:
    """:func:`event_differences` from the events' statistic and the frames' reference."""
    out = events.assign(frames_mean_nll=events["rotation"].map(reference).astype(float))
    out["difference"] = out["event_nll"] - out["frames_mean_nll"]
    return out.sort_values(["item_id", "rotation", "option"], ignore_index=True)[EVENT_COLUMNS]


# ---------------------------------------------------------------------------------------
# The bank-level tests on the final selection (4.3)
# ---------------------------------------------------------------------------------------
#: Columns of ``matched_frames`` that let the bank-level tests be re-run on another selection.
FINAL_BANK_COLUMNS = ("frame_mean_differences", "frame_nll", "event_surprisal")


def final_bank_columns(item_ids: Sequence[str], differences: pd.DataFrame, surprisal: pd.DataFrame,
                       event_classes: Sequence[str]) -> dict[str, list[str]]:
    """JSON columns for the ``matched_frames`` rows of ``item_ids``: each frame's per-kind mean
    difference and per-rotation NLL sums, and (on every row) the events' statistic."""
    per_frame = per_frame_differences(differences)
    sums = frame_nll_sums(surprisal)
    events = event_surprisal(surprisal, event_classes).to_json(orient="records")
    means = {i: dict(zip(g["kind"], g["difference"])) for i, g in per_frame.groupby("item_id")}
    nll = {i: g[["rotation", "sum", "n"]].to_dict(orient="records") for i, g in sums.groupby("item_id")}
    return {"frame_mean_differences": [json.dumps(means.get(i, {})) for i in item_ids],
            "frame_nll": [json.dumps(nll.get(i, [])) for i in item_ids],
            "event_surprisal": [events] * len(item_ids)}


def final_bank_matching(matched: pd.DataFrame, frames: Sequence[str], bound: float,
                        tolerance: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """4.3 "Across the retained bank, the mean differences must also be equivalent to zero",
    and the events' matching to the agent frames, on ``frames``: the FINAL confirmatory
    selection, after binding replacement (4.2), not the matching stage's own selection; a
    reserve frame brought in by binding changes the bank both tests are about. Returns
    (TOST table, event verdicts), read from the columns :func:`final_bank_columns` stores."""
    missing = [c for c in FINAL_BANK_COLUMNS if c not in matched.columns]
    if missing:
        raise ValueError(f"matched_frames lacks {missing}: re-materialise matched_frames")
    per_frame = pd.DataFrame([{"kind": k, "item_id": r.item_id, "difference": v}
                              for r in matched.itertuples() for k, v in json.loads(r.frame_mean_differences).items()],
                             columns=["kind", "item_id", "difference"])
    sums = pd.DataFrame([{"item_id": r.item_id, **x} for r in matched.itertuples() for x in json.loads(r.frame_nll)],
                        columns=["item_id", "rotation", "sum", "n"])
    events = pd.DataFrame(json.loads(matched["event_surprisal"].iloc[0]),
                          columns=["item_id", "event_class", "rotation", "option", "event_nll"])
    retained = set(frames)
    return (tost_over(per_frame, retained, bound),
            event_verdicts(events_against(events, reference_nll(sums, retained)), tolerance))


def event_verdicts(differences: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per event: the largest absolute difference over rotations and options, where it
    lies, and whether every difference is within the tolerance (inclusive; NaN fails).
    A failing event is rewritten before registration: the events have no reserve pool."""
    rows = []
    for (item_id, cls), part in differences.groupby(["item_id", "event_class"], sort=True):
        absolute = part["difference"].abs()
        worst = part.loc[absolute.fillna(float("inf")).idxmax()]
        rows.append({"item_id": item_id, "event_class": cls, "max_abs_difference": float(absolute.max()),
                     "worst_rotation": int(worst["rotation"]), "worst_option": int(worst["option"]),
                     "n_differences": len(part), "passes": bool((absolute <= tolerance).all())})
    return pd.DataFrame(rows, columns=EVENT_VERDICT_COLUMNS)


def read_tost(matched: pd.DataFrame) -> pd.DataFrame:
    """The bank-level TOST stored in a ``matched_frames`` table (an undefined p reads as NaN)."""
    tost = pd.DataFrame(json.loads(matched["tost"].iloc[0]), columns=TOST_COLUMNS)
    return tost.assign(tost_p=pd.to_numeric(tost["tost_p"]).astype(float))


def matching_problems(matched: pd.DataFrame, alpha: float, tost: pd.DataFrame | None = None,
                      events: pd.DataFrame | None = None) -> list[str]:
    """Everything that fails the matching gate (4.3), from a ``matched_frames`` table: fears
    short of frames, comparisons whose bank-level TOST does not show equivalence (NaN with
    fewer than two frames is not equivalence) and events outside the tolerance. ``tost`` and
    ``events`` (from :func:`final_bank_matching`) replace the matching stage's stored ones."""
    short = matched.groupby("fear")["frames_to_write"].max()
    problems = [f"write {n} new frame(s) for {fear}" for fear, n in short[short > 0].items()]
    tost = read_tost(matched) if tost is None else tost
    if tost.empty:
        problems.append("no frame is retained, so the bank-level equivalence cannot be tested")
    problems += [f"mean difference {r.comparison} not shown within the bound ("
                 + (f"TOST p = {r.tost_p:.3f} over {r.n} frames)" if pd.notna(r.tost_p) else
                    f"TOST not defined over {r.n} frame)")
                 for r in tost[~(tost["tost_p"] < alpha)].itertuples()]
    if events is None:
        events = pd.DataFrame(json.loads(matched["event_matching"].iloc[0]), columns=EVENT_VERDICT_COLUMNS)
    failing = events[~events["passes"].astype(bool)]
    unmatched = failing[failing["max_abs_difference"].isna()]
    if len(unmatched):
        problems.append(f"{len(unmatched)} event(s) cannot be matched: no agent frame is retained to match them to")
    problems += [f"rewrite event {r.item_id}: its surprisal differs from the agent frames' mean by "
                 f"{r.max_abs_difference:.3f} nats/token (rotation {r.worst_rotation}, option {r.worst_option})"
                 for r in failing[failing["max_abs_difference"].notna()].itertuples()]
    return problems


@dataclass(frozen=True)
class MatchingResult:
    """The matched-frames table (one row per frame) and what its metadata shows (4.3)."""

    table: pd.DataFrame
    shortfall: dict[str, int]
    tost: pd.DataFrame
    events: pd.DataFrame
    #: Frames passing under the tested and the base checkpoint; None without a base checkpoint.
    passing_both: list[str] | None
    drop_rate: pd.Series
    #: The registered per-frame tolerance (nats/token) the verdicts read.
    tolerance: float


def match_frames(sentence_surprisal: pd.DataFrame, base_sentence_surprisal: pd.DataFrame, bank: Bank,
                 view: Registered) -> MatchingResult:
    """Surprisal matching of one family under its tested checkpoint (protocol 4.3): per-frame
    verdicts against the registered tolerance, the replacement of failing confirmatory frames
    (rewrite, else the lowest-numbered passing reserve), the TOST on this selection, the
    events against the agent frames, the columns the registration record re-runs both tests
    from, and ``passes_base`` (frames that also pass under the base checkpoint)."""
    settings, family_key = view.settings, view.family.key
    rule = settings.matching
    event_classes = settings.bank.event_classes
    diffs = frame_differences(sentence_surprisal)
    verdicts = frame_verdicts(diffs, rule.max_abs_difference)
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    selection, shortfall = select_frames(verdicts, numbers, settings.confirmatory_frames_per_fear(family_key),
                                         {r.rewrite_of: r.id for r in bank.rewrites})
    tost = equivalence(diffs, set(selection["item_id"]), rule.tost_bound)
    events = event_verdicts(event_differences(sentence_surprisal, set(selection["item_id"]), event_classes),
                            rule.max_abs_difference)
    table = verdicts.merge(selection.rename(columns={"item_id": "selected"}), how="left",
                           left_on="item_id", right_on="selected", suffixes=("", "_sel"))
    table = table.assign(family=family_key, selected=table["selected"].notna(),
                         replaces=table["replaces"].fillna(""),
                         frames_to_write=table["fear"].map(shortfall).fillna(0).astype(int),
                         tost=tost.to_json(orient="records"), event_matching=events.to_json(orient="records"),
                         # 4.3: what the registration record needs to re-run both tests on the final bank.
                         **final_bank_columns(list(table["item_id"]), diffs, sentence_surprisal, event_classes))
    table = table.drop(columns=["fear_sel"], errors="ignore")
    # 4.3: the base-against-assistant comparison uses frames passing under both checkpoints.
    if len(base_sentence_surprisal):
        base = frame_verdicts(frame_differences(base_sentence_surprisal), rule.max_abs_difference)
        table["passes_base"] = table["item_id"].map(base.set_index("item_id")["passes"]).fillna(False).astype(bool)
    else:
        table["passes_base"] = pd.NA
    both = table[table["passes"] & (table["passes_base"] == True)]["item_id"].tolist()  # noqa: E712 (NA-safe)
    confirmatory = verdicts[verdicts["frame_set"] == "confirmatory"]
    drop = confirmatory.groupby("fear")["passes"].apply(lambda s: 1 - s.mean()).round(3)
    return MatchingResult(table, shortfall, tost, events, both if len(base_sentence_surprisal) else None, drop,
                          rule.max_abs_difference)


def matching_gate_verdict(matched: pd.DataFrame, settings: ProtocolSettings) -> tuple[list[str], bool]:
    """The matching gate on this stage's selection (4.3): its problems and whether a fear is
    short of frames (the only one that stops what follows; the bank-level tests warn here)."""
    return (matching_problems(matched, settings.matching.tost_alpha),
            bool((matched["frames_to_write"] > 0).any()))


def matching_gate_description(settings: ProtocolSettings) -> str:
    """The matching check's description, with the registered numbers (4.3)."""
    rule = settings.matching
    return ("Protocol 4.3: every fear keeps its registered number of confirmatory frames after "
            "matching and replacement, the retained bank's mean differences are equivalent to "
            f"zero within +-{rule.tost_bound:g} (TOST over frames, alpha {rule.tost_alpha:g}), and every "
            f"secondary-class event lies within {rule.max_abs_difference:.2f} of the agent frames' mean surprisal. "
            "Otherwise: how many frames to write per fear and which events to rewrite. The TOST and the events "
            "are read here on this stage's selection, as a warning; the registration record reads them on the "
            "final selection (after binding replacement), so only a fear short of frames stops what follows.")
