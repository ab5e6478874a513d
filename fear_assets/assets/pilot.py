"""Stage "pilot" (protocol 5, 6.3): depth band and H5 depth from pilot frames only."""

import dagster as dg
import pandas as pd

from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.pilot.depth_rules import depth_band, h5_depth
from fear_assets.pilot.matching import TOST_COLUMNS, equivalence, frame_differences, frame_verdicts, select_frames
from fear_assets.pilot.report_rule import mentions, partner_keywords
from fear_assets.resources.protocol import ProtocolResource

GROUP = "pilot"


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"}, ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family)})
def pilot_depths(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                 scores: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Depth band (H1-H4) and H5 depth, named as depth indices (protocol 5), from pilot
    frames only and pooled over all six cells (no agent-by-content contrast is read): the
    band is the depths at which the generated report mentions the neutral partner on 20-80%
    of trials (else the two closest to 50%); the H5 depth is the deepest depth with pooled
    forced-choice accuracy in 0.60-0.90 (else the one closest to 0.75)."""
    settings, bank = protocol.settings(), protocol.bank()
    neutral = int(settings.design["neutral_partner_option"])
    pilot = scores[scores["block"] == "pilot_primary"].copy()
    if pilot.empty:
        raise ValueError("no pilot_primary scores for this family: materialise scores for its depth partitions first")
    pilot["depth_index"] = pilot["depth"].str[1:].astype(int)

    def partner_mentioned(row) -> bool:
        item = bank.item(row.item_id)
        return mentions(row.generated_text, partner_keywords(item.partner.sentence,
                                                             item.partner.content_options[neutral - 1]))

    pilot["mentions_partner"] = [partner_mentioned(r) for r in pilot.itertuples()]
    by_depth = pilot.groupby("depth_index").agg(trials=("trial_id", "size"),
                                                neutral_mention_rate=("mentions_partner", "mean"),
                                                fc_accuracy=("fc_correct", "mean")).reset_index()
    rule, h5 = settings.section("depth_band"), settings.section("h5_depth")
    band, band_rule = depth_band(dict(zip(by_depth.depth_index, by_depth.neutral_mention_rate)),
                                 rule["neutral_mention_low"], rule["neutral_mention_high"], int(rule["min_depths"]),
                                 rule["fallback_target"])
    h5_index, h5_rule = h5_depth(dict(zip(by_depth.depth_index, by_depth.fc_accuracy.astype(float))),
                                 h5["accuracy_low"], h5["accuracy_high"], h5["fallback_target"])
    family = settings.family(context.partition_key)
    table = by_depth.assign(
        family=context.partition_key, depth=[f"d{d}" for d in by_depth.depth_index],
        depth_tokens=[family.tokens_at(int(d)) for d in by_depth.depth_index],
        in_band=by_depth.depth_index.isin(band), is_h5_depth=by_depth.depth_index == h5_index,
        depth_band=",".join(map(str, band)), h5_depth=h5_index, band_rule=band_rule, h5_rule=h5_rule)
    return dg.Output(table, metadata={
        "depth band": ", ".join(f"d{d}" for d in band), "band rule": band_rule,
        "H5 depth": f"d{h5_index}", "H5 rule": h5_rule,
        "by depth": dg.MetadataValue.md(table[["depth", "depth_tokens", "trials", "neutral_mention_rate",
                                               "fc_accuracy", "in_band", "is_h5_depth"]].round(3).to_markdown(index=False)),
    })


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def matched_frames(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   sentence_surprisal: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Surprisal matching (protocol 4.3) under this family's tested checkpoint: per frame the
    largest threat/harmless and agent-pair difference in mean non-name surprisal over the
    three rotations and both options (retained within 0.10 nats/token), the replacement of a
    failing confirmatory frame by the lowest-numbered passing reserve of its fear, the drop
    rate by fear, and two one-sided tests that the retained bank's mean differences lie
    within +-0.05."""
    settings, bank = protocol.settings(), protocol.bank()
    family = settings.family(context.partition_key)
    rule = settings.section("matching")
    diffs = frame_differences(sentence_surprisal)
    verdicts = frame_verdicts(diffs, float(rule["max_abs_difference"]))
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    required = (family.reduced_design.confirmatory_frames_per_fear if family.reduced_design
                else int(settings.design["confirmatory_frames_required"]) // len(settings.fears))
    selection, shortfall = select_frames(verdicts, numbers, required)
    tost = equivalence(diffs, set(selection["item_id"]), float(rule["tost_bound"]))
    table = verdicts.merge(selection.rename(columns={"item_id": "selected"}), how="left",
                           left_on="item_id", right_on="selected", suffixes=("", "_sel"))
    table = table.assign(family=context.partition_key, selected=table["selected"].notna(),
                         replaces=table["replaces"].fillna(""),
                         frames_to_write=table["fear"].map(shortfall).fillna(0).astype(int),
                         tost=tost.to_json(orient="records"))
    table = table.drop(columns=["fear_sel"], errors="ignore")
    confirmatory = verdicts[verdicts["frame_set"] == "confirmatory"]
    drop = confirmatory.groupby("fear")["passes"].apply(lambda s: 1 - s.mean()).round(3)
    return dg.Output(table, metadata={
        "retained confirmatory frames": int(table["selected"].sum()),
        "frames to write": dg.MetadataValue.json(shortfall),
        "drop rate by fear": dg.MetadataValue.md(drop.to_frame("drop rate").to_markdown()),
        "TOST (+-bound) across the retained bank": dg.MetadataValue.md(tost.round(4).to_markdown(index=False)),
    })


@dg.asset_check(asset=matched_frames, description=(
    "Protocol 4.3: every fear keeps its registered number of confirmatory frames after "
    "matching and replacement, and the retained bank's mean differences are equivalent to "
    "zero within +-0.05 (TOST, alpha 0.05). Otherwise: how many frames to write per fear."))
def matching_gate(protocol: ProtocolResource, matched_frames: pd.DataFrame) -> dg.AssetCheckResult:
    import json

    alpha = float(protocol.settings().section("matching")["tost_alpha"])
    short = matched_frames.groupby("fear")["frames_to_write"].max()
    short = short[short > 0]
    tost = pd.DataFrame(json.loads(matched_frames["tost"].iloc[0]), columns=TOST_COLUMNS)
    not_equivalent = tost[tost["tost_p"] >= alpha]
    problems = [f"write {n} new frame(s) for {fear}" for fear, n in short.items()]
    if tost.empty:
        problems.append("no frame is retained, so the bank-level equivalence cannot be tested")
    problems += [f"mean difference {r.comparison} not shown within the bound (TOST p = {r.tost_p:.3f})"
                 for r in not_equivalent.itertuples()]
    return dg.AssetCheckResult(
        passed=not problems,
        description="matching passes" if not problems else
        "; ".join(problems) + ". New frames go through the same matching before registration (4.3).",
        metadata={"TOST": dg.MetadataValue.md(tost.round(4).to_markdown(index=False))},
    )
