"""The power gate (protocol 6.3, Appendix C step 3; D7), in stage "registration": 6.3 gates it.

Wiring only; the science is in ``fear_assets.simulation`` (registered code hash).
- ``power_pilot_estimates`` (per family): the pilot's primary fit, whose posterior means are
  the pilot estimates every dataset is generated from.
- ``power_simulation`` (family x batch, batch = ``<scenario>.f<frames>.b<batch>``; each
  family's own batches only, ``partitions.power_partitions``): fits one
  batch of datasets and writes one Parquet file (atomic); a finished batch is never refitted,
  so a stopped backfill resumes where it stopped. Steps never write DuckDB.
- ``power_summary`` (per family): tallies every finished batch through DuckDB, applies 6.3's
  targets and rules, and writes the power section of the registration record; its check
  ``power_targets_met`` is the gate (blocking in confirmatory mode, like every registration gate).
"""

import dagster as dg
import pandas as pd

from fear_assets.defs.metadata import metadata_image
from fear_assets.core.numbers import number
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import FAMILY_EXPR, all_batches_of_family, all_depths_of_family, batch_parts, \
    family_of_batch, family_partitions, power_partitions
from fear_assets.defs.resources.power import PowerSamplerResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.report import plots as report_plots
from fear_assets.simulation import steps as simulation_steps


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "pymc"},
          ins={"pilot_scores": dg.AssetIn(partition_mapping=all_depths_of_family),
               "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)})
def power_pilot_estimates(context: dg.AssetExecutionContext, protocol: ProtocolResource, pilot_scores: pd.DataFrame,
                          assignment_key: pd.DataFrame, sentence_surprisal: pd.DataFrame, pilot_depths: pd.DataFrame,
                          pilot_controls: pd.DataFrame, pilot_probe_outputs: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.3: the pilot estimates the simulation generates from: posterior means of the registered
    primary model (the demo family: with the demo's shorter sampler) on the pilot frames (fixed effects, frame and unit variance components,
    residual scale, nu), the spread of the two surprisal covariates, the pilot contrasts
    of the positive controls, gate (b)'s recall fit and the judge's residual SD (each with its
    own scale, or a stated fallback), and (a registered family) H4's model on the pilot probe and H5's
    probit on the pilot's forced choices."""

    family_key = context.partition_key
    r = simulation_steps.power_pilot_estimates(
        protocol.view(family_key), protocol.bank(), pilot_scores, assignment_key,
        sentence_surprisal, pilot_depths, pilot_controls, pilot_probe_outputs)
    est = r.estimates
    return dg.Output(r.table, metadata=named_metadata(context, {
        "band": ", ".join(r.band), "pilot trials": r.pilot_trials, "sigma": number(est.sigma),
        "unit sd": number(est.unit_sd), "frame sds": ", ".join(number(x) for x in est.frame_sd),
        "controls (pilot means)": "; ".join(f"{k} {number(v)}" for k, v in r.controls.items()) or "none",
        "gate (b) generated from": r.gate_b_source, "gate (c) judge scale": r.judge_source}))


#: A target's verdict as a word (None: its component was not simulated).
MET_TEXT = {True: "yes", False: "no"}

#: Each batch step samples 2 chains (one per core). Pool "power" bounds how many run at once on
#: one machine (`dagster instance concurrency set power <cores / 2>`); under the Kubernetes
#: executor each step is its own pod with these requests (deploy/kubernetes/power.md).
POWER_OP_TAGS = {"dagster-k8s/config": {"container_config": {"resources": {
    "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}}}}


@dg.asset(partitions_def=power_partitions, kinds={"pymc", "parquet"}, pool="power",
          op_tags=POWER_OP_TAGS,
          ins={"power_pilot_estimates": dg.AssetIn(partition_mapping=family_of_batch)})
def power_simulation(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                     power_sampler: PowerSamplerResource, power_pilot_estimates: pd.DataFrame) -> dg.MaterializeResult:
    """6.3: one batch of simulated datasets on the registered design at its frame count, each
    fitted under exactly the registered priors; labels, HDIs and every fit's R-hat, ESS and
    divergences go to one Parquet file. A batch whose file exists is finished and is not
    refitted. The path: the registered nutpie loop (compiled once per shape and process, data
    swapped per dataset), or, where the host's ``power_sampler`` says so (a GPU and a passed
    validation), the accelerator path (the batch's datasets in one compiled program under the
    registered ``simulation_sampler``); the metadata names the path, why, its settings and the
    validation's status."""

    family_key, key = batch_parts(context)
    view = protocol.view(family_key)
    # asked only for a batch to fit: a finished one is not refitted, and JAX stays unloaded
    batch = simulation_steps.power_batch(
        view, key, power_pilot_estimates, protocol.output_path("power"), log=context.log.info,
        route=lambda: power_sampler.route(view.simulation_sampler, view.confirmatory))
    if batch.resumed:
        context.log.info(f"{key}: finished earlier ({batch.path}); not refitted")
        return dg.MaterializeResult(metadata=named_metadata(context, {"path": str(batch.path), "resumed": True}))
    return dg.MaterializeResult(metadata=named_metadata(context, {
        "path": str(batch.path), "datasets": batch.datasets, "rows (trials per block)": batch.rows,
        "seconds": batch.seconds, "compilations (this process)": batch.compilations,
        "frame effects sampled (registered rule, per dataset; same prior either way)": batch.frame_forms,
        "fits missing the convergence rule": batch.not_converged,
        "label frequencies (plot)": metadata_image(report_plots.label_frequency_plot(batch.labels),
                                                   "power simulation label frequencies"),
        "labels": md_table(batch.label_counts),
        "sampler path": f"{batch.sampler['path']} ({batch.sampler['reason']})",
        "sampler settings": ", ".join(f"{k} {v}" for k, v in batch.sampler["settings"].items()),
        "accelerator validation": batch.sampler["validation"],
        "demo": view.embedded}))


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "json"},
          deps=[dg.AssetDep(power_simulation, partition_mapping=all_batches_of_family)])
def power_summary(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                  power_pilot_estimates: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.3: label frequencies per hypothesis, scenario and frame count with Monte Carlo SEs,
    every registered target, the frame count (blocks of 10 up to 100), the hypotheses declared
    estimation-only and the traced source of a joint shortfall; written to the registration
    record's power section. The embedded family's figures are a reduced demo, NOT the
    registered simulation."""

    family_key = context.partition_key
    summary = simulation_steps.power_summary(protocol.view(family_key), power_pilot_estimates,
                                             protocol.output_path("power"), protocol.registration_dir)
    decision, table = summary.decision, summary.table
    context.log.info(f"power gate {family_key}: {decision['status']}; frames {decision['frames']}; "
                     f"estimation-only {decision['estimation_only'] or 'none'}")
    shown = table[["target", "frames", "rate", "mcse", "n", "bound", "met", "note"]].copy()
    # A target whose component was not simulated is not computable, not "nan".
    shown["met"] = [MET_TEXT.get(m, "not computable") if not pd.isna(m) else "not computable" for m in shown["met"]]
    decides = not summary.demo and str(decision["status"]) == "complete"
    return dg.Output(table, metadata=named_metadata(context, {
        "status": decision["status"], "frames": str(decision["frames"]), "demo (not registered)": summary.demo,
        "estimation-only": ", ".join(decision["estimation_only"]) or "none",
        "datasets per sampler": ", ".join(f"{k} {v}" for k, v in summary.samplers.items()) or "none",
        "joint shortfall source": decision["joint_shortfall_source"] or "none",
        "gates underpowered": decision["gates_underpowered"] if decides else
        "not decided (only the registered, complete simulation decides)",
        "targets": md_table(shown, {"rate": "rate", "mcse": "rate", "bound": "rate"})}))


@dg.asset_check(asset=power_summary, blocking=True, description=GATE_DESCRIPTION + (
    "6.3: every registered target of the power simulation is met at the decided frame count (a "
    "target whose component is not simulated counts as not met); a hypothesis still short at 100 "
    "frames is declared estimation-only and a joint shortfall traced to the gates makes them "
    "descriptive, as 6.3 fixes in advance."))
def power_targets_met(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, power_summary: pd.DataFrame) -> dg.AssetCheckResult:
    required = simulation_steps.required_rows(power_summary)
    missed = simulation_steps.targets_missed(power_summary)
    frames = sorted(power_summary["frames"].unique())
    gated = sorted(required["frames"].unique())
    demo = bool(power_summary["demo"].iloc[0]) if len(power_summary) else False
    # Counted over the targets the gate requires so the three numbers add up (a target whose
    # component was not simulated is not computable, never met).
    met = required["met"] if "met" in required else pd.Series(dtype="boolean")
    counts = {"targets met": int((met == True).sum()),  # noqa: E712 (NA: not computable)
              "targets missed": int((met == False).sum()),  # noqa: E712
              "targets not computable": int(met.isna().sum())}
    said = f"{counts['targets missed']} missed and {counts['targets not computable']} not computable of {len(met)}"
    example = f", e.g. {missed['target'].iloc[0]}" if len(missed) else ""
    decided = len(required) > 0
    return gate_result(
        context, power_summary, passed=simulation_steps.power_targets_passed(power_summary),
        severity=gate_severity(protocol, context, power_summary),
        metadata={**counts, "frames examined": ", ".join(map(str, frames)),
                  "frame count judged": ", ".join(map(str, gated)) or "none decided yet",
                  "targets not required (6.3's fixed rules)": int(len(power_summary) - len(required)),
                  "demo (not registered)": demo},
        description=("no frame count decided yet: simulate the next frame count (6.3)" if not decided else
                     "all registered targets met" if missed.empty else
                     f"targets: {said}{example}: add frames (the next block of 10) and simulate it, or declare "
                     "the hypothesis estimation-only at 100 frames (6.3)"
                     + (" [reduced demo, not the registered simulation]" if demo else "")))
