"""The pilot's carriage probe (protocol 6.3 pilot decoding and ceiling; 6.1 control probes)."""

import dagster as dg
import pandas as pd

from fear_assets.defs.assets.probes import AT_CHANCE_DOC, CONTROLS_DOC, OUTPUTS_DOC, at_chance, probe_frame_set, probe_metadata
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.pilot.depth_rules import stored_band
from fear_assets.probes.carriage import ProbeSettings, pilot_rules
from fear_assets.defs.resources.protocol import ProtocolResource


@dg.multi_asset(
    partitions_def=family_partitions, pool="duckdb", can_subset=False,
    ins={"pilot_scores": dg.AssetIn(partition_mapping=all_depths_of_family), "pilot_depths": dg.AssetIn()},
    outs={"pilot_probe_outputs": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"},
                                             description=OUTPUTS_DOC + " Pilot frames."),
          "pilot_probe_controls": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"},
                                              description=CONTROLS_DOC + " Pilot frames, with the 6.3 pilot rules.")},
)
def pilot_probes(context: dg.AssetExecutionContext, protocol: ProtocolResource, pilot_scores: pd.DataFrame,
                 pilot_depths: pd.DataFrame):
    """The carriage probe on the pilot frames (6.3): "the probe must decode the option at the
    shallowest depth; if mean accuracy at the band depths exceeds 0.95, H4 is declared
    estimation-only before collection"; with the 6.1 control probes."""
    settings = protocol.settings()
    family_key = context.partition_key
    out, ctrl = probe_frame_set(context, settings, family_key, pilot_scores, "pilot")
    if out is None:
        raise ValueError("no pilot probe blocks were scored: materialise pilot_scores for every depth first")
    band = stored_band(pilot_depths)
    rules = pilot_rules(out, shallowest=int(out["depth_index"].min()), band=band,
                        ceiling=settings.probe.ceiling_accuracy, level=ProbeSettings.from_settings(settings).interval)
    ctrl = ctrl.assign(decodes_at_shallowest=rules["decodes_at_shallowest"],
                       band_mean_accuracy=rules["band_mean_accuracy"], h4_estimation_only=rules["h4_estimation_only"],
                       band_depths=",".join(map(str, band)))
    meta_out, meta_ctrl = probe_metadata(out, ctrl)
    yield dg.Output(out, output_name="pilot_probe_outputs", metadata=meta_out)
    yield dg.Output(ctrl, output_name="pilot_probe_controls", metadata=meta_ctrl)


@dg.asset_check(asset="pilot_probe_controls", blocking=False, description=AT_CHANCE_DOC)
def pilot_controls_at_chance(pilot_probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    return at_chance(pilot_probe_controls)


@dg.asset_check(asset="pilot_probe_controls", blocking=GATES_BLOCK, description=(
    "Protocol 6.3 pilot probe rules: the probe decodes the option at the shallowest depth (the "
    "check's verdict); mean accuracy at the band depths above the ceiling declares H4 "
    "estimation-only before collection (6.1), which the record carries to H4's row: reported "
    "here, never a failure, since H4 does not change the reading (6.2)."))
def pilot_probe_rules(pilot_probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    pilot = pilot_probe_controls[pilot_probe_controls["probe"] == "probe"]
    if pilot.empty:
        return dg.AssetCheckResult(passed=False, description="no pilot probe ran: score the pilot probe blocks first")
    row = pilot.iloc[0]
    passed = bool(row["decodes_at_shallowest"])  # the ceiling is a declaration about H4, not a failure
    what = []
    if not row["decodes_at_shallowest"]:
        what.append("the probe does not decode the option at the shallowest depth (99% interval includes 0.5)")
    if row["h4_estimation_only"]:
        what.append(f"mean accuracy at band depths {row['band_depths']} is {row['band_mean_accuracy']:.3f} > ceiling: "
                    "H4 is declared estimation-only before collection (carried to H4's row)")
    if passed and not what:
        what.append("decodes at the shallowest depth; below ceiling")
    elif passed:
        what.insert(0, "decodes at the shallowest depth")
    return dg.AssetCheckResult(passed=passed, description="; ".join(what),
                               metadata={"band depths": row["band_depths"],
                                         "band mean accuracy": float(row["band_mean_accuracy"]),
                                         "h4 estimation-only": bool(row["h4_estimation_only"]),
                                         "next step": "none" if passed else
                                         "the probe does not decode at the shallowest depth: look for a fault in "
                                         "the probe's inputs before registration"})
