"""Stage "probes" (protocol 4.5 Branch 3, 6.1 H4 rules, 6.3 pilot decoding and ceiling)."""

import os

import dagster as dg

from fear_assets.report import plots as report_plots  # issue 15: gate figures as metadata
import numpy as np
import pandas as pd

from fear_assets.hashing import sha256_file
from fear_assets.modes import GATES_BLOCK
from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.probes.carriage import ProbeSettings, h4_interpretable, pilot_rules, run_probes
from fear_assets.resources.protocol import ProtocolResource

GROUP = "probes"
PROBE_BLOCKS = {"pilot": ("pilot_primary", "pilot_probe_other_option", "pilot_probe_no_agent"),
                "confirmatory": ("primary", "probe_other_option", "probe_no_agent")}


def load_features(scored: pd.DataFrame) -> np.ndarray:
    """Features of the scored rows (in their order), from their checksummed files (Appendix B)."""
    parts = []
    for (path, digest), part in scored.groupby(["features_file", "features_sha256"], sort=False):
        if sha256_file(path) != digest:
            raise ValueError(f"{path}: sha256 differs from the one recorded in scores; re-materialise scores")
        parts.append(pd.DataFrame(np.load(path)[part["feature_row"].to_numpy()], index=part.index))
    if not parts:
        return np.zeros((len(scored), 0), np.float32)
    return pd.concat(parts).loc[scored.index].to_numpy(np.float32)


def probe_inputs(scores: pd.DataFrame, blocks: tuple[str, str, str]):
    from fear_assets.analysis.data import kept

    agent_blocks, no_agent_block = blocks[:2], blocks[2]
    scores = kept(scores)  # 4.8: an excluded trial (over the window, truncated answer) enters no probe
    docs = scores[scores["block"].isin(agent_blocks) & (scores["feature_row"] >= 0)].copy()
    docs["depth_index"] = docs["depth"].str[1:].astype(int)
    X = load_features(docs)
    no_agent = scores[(scores["block"] == no_agent_block) & (scores["feature_row"] >= 0)].copy()
    if no_agent.empty:
        return X, docs.reset_index(drop=True), None, None
    no_agent["depth_index"] = no_agent["depth"].str[1:].astype(int)
    # Labels for a document without the agent sentence: the option each cell's document
    # of the same unit shows (codes, never cells: the analysis stays masked).
    primary = docs[docs["block"] == agent_blocks[0]][["item_id", "rotation", "order", "depth_index",
                                                      "condition_code", "content_option"]]
    expanded = no_agent.drop(columns=["condition_code", "content_option"]).reset_index().merge(
        primary, on=["item_id", "rotation", "order", "depth_index"])
    Xna = load_features(no_agent)[no_agent.index.get_indexer(expanded["index"])]
    return X, docs.reset_index(drop=True), Xna, expanded


@dg.multi_asset(
    group_name=GROUP, partitions_def=family_partitions, pool="duckdb", can_subset=False,
    ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family), "pilot_depths": dg.AssetIn()},
    outs={"probe_outputs": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"},
                                       description="Per probed document (both content versions), the held-out "
                                                   "probability of the shown option, clipped to [0.001, 0.999], and "
                                                   "its log-odds: H4's input (protocol 4.5, 6.1)."),
          "probe_controls": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"},
                                        description="Held-out accuracy of the probe and of each control probe with "
                                                    "its 99% interval, and the pilot rules (protocol 6.1, 6.3).")},
)
def probes(context: dg.AssetExecutionContext, protocol: ProtocolResource, scores: pd.DataFrame,
           pilot_depths: pd.DataFrame):
    """The carriage probe of one family, every frame's three rotation folds in parallel."""
    settings = protocol.settings()
    family_key = context.partition_key
    config = ProbeSettings.from_settings(settings)
    n_jobs = max(1, os.cpu_count() or 1)
    outputs, controls = [], []
    for frame_set, blocks in PROBE_BLOCKS.items():
        if not scores["block"].isin(blocks[:2]).any():
            continue
        X, meta, Xna, na = probe_inputs(scores, blocks)
        out, ctrl = run_probes(X, meta, config, Xna, na, n_jobs=n_jobs)
        context.log.info(f"{family_key} {frame_set}: {len(out)} held-out predictions from "
                         f"{meta['item_id'].nunique()} frames x 3 folds on {n_jobs} cores")
        outputs.append(out.assign(family=family_key, frame_set=frame_set))
        ctrl = ctrl.assign(family=family_key, frame_set=frame_set, h4_interpretable=h4_interpretable(ctrl))
        if frame_set == "pilot":
            band = [int(d) for d in pilot_depths["depth_band"].iloc[0].split(",")]
            rules = pilot_rules(out, shallowest=int(out["depth_index"].min()), band=band,
                                ceiling=float(settings.section("probe")["ceiling_accuracy"]), level=config.interval)
            ctrl = ctrl.assign(decodes_at_shallowest=rules["decodes_at_shallowest"],
                               band_mean_accuracy=rules["band_mean_accuracy"],
                               h4_estimation_only=rules["h4_estimation_only"],
                               band_depths=",".join(map(str, band)))
        controls.append(ctrl)
    outputs = pd.concat(outputs, ignore_index=True)
    controls = pd.concat(controls, ignore_index=True)
    shown = controls[["frame_set", "probe", "accuracy", "interval_low", "interval_high", "excludes_chance"]]
    yield dg.Output(outputs, output_name="probe_outputs", metadata={
        "documents": len(outputs), "mean accuracy": round(float(outputs["correct"].mean()), 4),
        "probe accuracy by depth with controls (plot)": report_plots.metadata_image(report_plots.probe_accuracy_plot(outputs, controls), "probe accuracy by depth with its controls"),  # issue 15
        "accuracy by depth": dg.MetadataValue.md(
            outputs.groupby(["frame_set", "depth_index"])["correct"].mean().round(3).to_frame().to_markdown()),
    })
    yield dg.Output(controls, output_name="probe_controls", metadata={
        "controls": dg.MetadataValue.md(shown.round(4).to_markdown(index=False)),
    })


@dg.asset_check(asset="probe_controls", blocking=GATES_BLOCK, description=(
    "Protocol 6.1: every control probe (cell+order+depth, order+depth, depth, shuffled labels, "
    "no agent sentence) decodes at chance: its 99% interval includes 0.5. Otherwise H4 is "
    "uninterpretable for this configuration."))
def controls_at_chance(probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    bad = probe_controls[(probe_controls["probe"] != "probe") & probe_controls["excludes_chance"]]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="all control probes at chance" if bad.empty else
        "H4 is uninterpretable: these controls decode above or below chance: "
        + ", ".join(f"{r.frame_set}/{r.probe} ({r.accuracy:.3f})" for r in bad.itertuples()),
        metadata={"controls": dg.MetadataValue.md(probe_controls[["frame_set", "probe", "accuracy", "interval_low",
                                                                  "interval_high"]].round(4).to_markdown(index=False))},
    )


@dg.asset_check(asset="probe_controls", blocking=GATES_BLOCK, description=(
    "Protocol 6.3 pilot probe rules: the probe decodes the option at the shallowest depth, "
    "and mean accuracy at the band depths is not above the ceiling (0.95); above it, H4 is "
    "declared estimation-only before collection."))
def pilot_probe_rules(probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    pilot = probe_controls[(probe_controls["frame_set"] == "pilot") & (probe_controls["probe"] == "probe")]
    if pilot.empty:
        return dg.AssetCheckResult(passed=False, description="no pilot probe ran: score the pilot probe blocks first")
    row = pilot.iloc[0]
    passed = bool(row["decodes_at_shallowest"]) and not bool(row["h4_estimation_only"])
    what = []
    if not row["decodes_at_shallowest"]:
        what.append("the probe does not decode the option at the shallowest depth (99% interval includes 0.5)")
    if row["h4_estimation_only"]:
        what.append(f"mean accuracy at band depths {row['band_depths']} is {row['band_mean_accuracy']:.3f} > ceiling: "
                    "H4 is estimation-only")
    return dg.AssetCheckResult(passed=passed, description="; ".join(what) or "decodes at the shallowest depth; below ceiling",
                               metadata={"band depths": row["band_depths"],
                                         "band mean accuracy": float(row["band_mean_accuracy"]),
                                         "h4 estimation-only": bool(row["h4_estimation_only"])})
