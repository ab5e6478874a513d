"""The pilot's carriage probe (protocol 6.3 pilot decoding and ceiling; 6.1 control probes)."""

import dagster as dg
import pandas as pd

from fear_assets.defs.assets.probes import AT_CHANCE_DOC, CONTROLS_DOC, OUTPUTS_DOC, at_chance, probe_frame_set, probe_metadata
from fear_assets.core.numbers import number
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.probes.pilot_probe import pilot_probe_controls, pilot_probe_rules_description, pilot_probe_verdict
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
    ctrl = pilot_probe_controls(out, ctrl, pilot_depths, protocol.view(family_key))
    meta_out, meta_ctrl = probe_metadata(context, out, ctrl)
    yield dg.Output(out, output_name="pilot_probe_outputs", metadata=meta_out)
    yield dg.Output(ctrl, output_name="pilot_probe_controls", metadata=meta_ctrl)


@dg.asset_check(asset="pilot_probe_controls", blocking=False, description=AT_CHANCE_DOC)
def pilot_controls_at_chance(context: dg.AssetCheckExecutionContext,
                             pilot_probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    return at_chance(pilot_probe_controls, context)


@dg.asset_check(asset="pilot_probe_controls", blocking=True,
                description=GATE_DESCRIPTION + pilot_probe_rules_description(DEFINITION_SETTINGS))
def pilot_probe_rules(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, pilot_probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    verdict = pilot_probe_verdict(pilot_probe_controls)
    severity = gate_severity(protocol, context, pilot_probe_controls)
    if verdict.row is None:
        return gate_result(context, pilot_probe_controls, passed=False, description=verdict.description,
                           severity=severity, metadata={"next step": "materialise pilot_probe_outputs first"})
    row = verdict.row
    return gate_result(context, pilot_probe_controls, passed=verdict.passed, description=verdict.description,
                       severity=severity,
                               metadata={"band depths": row["band_depths"],
                                         "band mean accuracy": number(row["band_mean_accuracy"], "rate"),
                                         "h4 estimation-only": bool(row["h4_estimation_only"]),
                                         "next step": "none" if verdict.passed else
                                         "the probe does not decode at the shallowest depth: look for a fault in "
                                         "the probe's inputs before registration"})
