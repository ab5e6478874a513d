"""Stage "probes" (protocol 4.5 Branch 3, 6.1): the carriage probe on the confirmatory
frames, H4's input. The pilot's probe (decoding and ceiling rules, 6.3) is
``pilot_probe_outputs`` in stage pilot; both run the same wiring below."""

import os

import dagster as dg
import pandas as pd

from fear_assets.core.numbers import number
from fear_assets.defs.metadata import metadata_image
from fear_assets.defs.modes import gate_result, md_table, named_metadata
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.core.registered import registered
from fear_assets.probes.steps import at_chance_description, controls_off_chance, frame_set_probe
from fear_assets.report import plots as report_plots
from fear_assets.defs.resources.protocol import ProtocolResource

OUTPUTS_DOC = ("Per probed document (both content versions), the held-out probability of the shown option, "
               "clipped to [0.001, 0.999], and its log-odds: H4's input (protocol 4.5, 6.1).")
CONTROLS_DOC = ("Held-out accuracy of the probe and of each control probe with its 99% interval "
                "(protocol 6.1: every control probe must decode at chance).")


def probe_frame_set(context, settings, family_key: str, scores: pd.DataFrame, frame_set: str):
    """(outputs, controls) of one frame set's probe, every frame's three rotation folds in
    parallel; (None, None) where the frame set's blocks were not scored."""
    n_jobs = max(1, os.cpu_count() or 1)
    result = frame_set_probe(registered(settings, family_key), scores, frame_set, n_jobs)
    if result.outputs is None:
        return None, None
    context.log.info(f"{family_key} {frame_set}: {len(result.outputs)} held-out predictions from "
                     f"{result.frames} frames x 3 folds on {n_jobs} cores")
    return result.outputs, result.controls


#: Accuracies and their interval read as rates.
ACCURACY = {"accuracy": "rate", "interval_low": "rate", "interval_high": "rate", "correct": "rate"}


def probe_metadata(context, outputs: pd.DataFrame, controls: pd.DataFrame) -> tuple[dict, dict]:
    """The metadata of a probe's outputs and controls, each naming the family and partition."""
    if outputs.empty:
        return (named_metadata(context, {"documents": 0, "note": "no probed documents in this design"}),
                named_metadata(context, {"controls": "none"}))
    shown = controls[["frame_set", "probe", "accuracy", "interval_low", "interval_high", "excludes_chance"]]
    by_depth = outputs.groupby(["frame_set", "depth_index"])["correct"].mean().to_frame()
    return (named_metadata(context, {
                "documents": len(outputs), "mean accuracy": number(outputs["correct"].mean(), "rate"),
                "probe accuracy by depth with controls (plot)": metadata_image(
                    report_plots.probe_accuracy_plot(outputs, controls), "probe accuracy by depth with its controls"),
                "accuracy by depth": md_table(by_depth, ACCURACY, index=True)}),
            named_metadata(context, {"controls": md_table(shown, ACCURACY)}))


@dg.multi_asset(
    partitions_def=family_partitions, pool="duckdb", can_subset=False,
    ins={"confirmatory_scores": dg.AssetIn(partition_mapping=all_depths_of_family)},
    outs={"probe_outputs": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"}, description=OUTPUTS_DOC),
          "probe_controls": dg.AssetOut(metadata=FAMILY_EXPR, kinds={"duckdb", "sklearn"}, description=CONTROLS_DOC)},
)
def probes(context: dg.AssetExecutionContext, protocol: ProtocolResource, confirmatory_scores: pd.DataFrame):
    """The carriage probe of one family on the confirmatory frames (4.5 Branch 3, 6.1):
    "a linear probe on the residual stream, trained and tested across rotation folds".
    Empty where the design scores no confirmatory probe block (the embedded demo); H4 then
    reads the pilot's probe, flagged descriptive."""
    family_key = context.partition_key
    out, ctrl = probe_frame_set(context, protocol.settings(), family_key, confirmatory_scores, "confirmatory")
    outputs = out if out is not None else pd.DataFrame({"family": pd.Series(dtype=str)})
    controls = ctrl if ctrl is not None else pd.DataFrame({"family": pd.Series(dtype=str)})
    meta_out, meta_ctrl = probe_metadata(context, outputs, controls)
    yield dg.Output(outputs, output_name="probe_outputs", metadata=meta_out)
    yield dg.Output(controls, output_name="probe_controls", metadata=meta_ctrl)


#: Built from the registered settings file (the description is fixed when the definitions load).
AT_CHANCE_DOC = at_chance_description(DEFINITION_SETTINGS)


def at_chance(controls: pd.DataFrame, context=None) -> dg.AssetCheckResult:
    """The 6.1 control-probe check on one probe_controls table. A failure is a warning: it
    declares H4 uninterpretable (a flag on H4's row), and H4 never changes the reading (6.2),
    so it must not stop H2, H5 or the reading."""
    if controls.empty:
        return gate_result(context, controls, passed=True, description="no probe ran in this design: nothing to check")
    bad = controls_off_chance(controls)
    return gate_result(
        context, controls, passed=bad.empty, severity=dg.AssetCheckSeverity.WARN,
        description="all control probes at chance" if bad.empty else
        "H4 is uninterpretable: these controls decode above or below chance: "
        + ", ".join(f"{r.frame_set}/{r.probe} ({r.accuracy:.3f})" for r in bad.itertuples())
        + ". Next: look for a confound in the listed factor (frame, order, depth) before collection",
        metadata={"controls": md_table(controls[["frame_set", "probe", "accuracy", "interval_low", "interval_high"]],
                                       ACCURACY)})


@dg.asset_check(asset="probe_controls", blocking=False, description=AT_CHANCE_DOC)
def controls_at_chance(context: dg.AssetCheckExecutionContext, probe_controls: pd.DataFrame) -> dg.AssetCheckResult:
    return at_chance(probe_controls, context)
