"""The power gate (protocol 6.3, Appendix C step 3; D7), in stage "registration": 6.3 gates it.

Wiring only; the science is in ``fear_assets.simulation`` (registered code hash).
- ``power_pilot_estimates`` (per family): the pilot's primary fit, whose posterior means are
  the pilot estimates every dataset is generated from.
- ``power_simulation`` (family x batch, batch = ``<scenario>.f<frames>.b<batch>``): fits one
  batch of datasets and writes one Parquet file (atomic); a finished batch is never refitted,
  so a stopped backfill resumes where it stopped. Steps never write DuckDB.
- ``power_summary`` (per family): tallies every finished batch through DuckDB, applies 6.3's
  targets and rules, and writes the power section of the registration record; its check
  ``power_targets_met`` is the gate (blocking in confirmatory mode, like every registration gate).
"""


import dataclasses
import json
import time
from pathlib import Path

import dagster as dg

from fear_assets.defs.metadata import metadata_image
from fear_assets.report import plots as report_plots  # issue 15: gate figures as metadata
import pandas as pd

from fear_assets.models.data import model_table
from fear_assets.models.fits import fit_cells
from fear_assets.models.h5_model import H5Priors
from fear_assets.analysis.unmasking import unmask_pilot
from fear_assets.core.hashing import derived_seed
from fear_assets.pilot.depth_rules import band_keys, stored_band
from fear_assets.registration.record import write_power_section
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import NOT_SIMULATED
from fear_assets.simulation.generator import PRIMARY_MODEL_BLOCKS, PilotEstimates
from fear_assets.simulation.generator import pilot_estimates
from fear_assets.analysis.h4 import h4_data
from fear_assets.models.primary_model import Priors
from fear_assets.simulation.models import h4_pilot_fit, h5_pilot_estimates, h5_pilot_rows
from fear_assets.simulation.sampling import frame_forms_record
from fear_assets.simulation.setup import fitter_for, run_key, sampler_of
from fear_assets.simulation.runner import Rules, dataset_seed, run_batch
from fear_assets.simulation.store import batch_path, parse_batch_key, write_batch
from fear_assets.simulation.store import read_batches
from fear_assets.simulation.targets import PowerTargets, decide, label_frequencies
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import (BATCH, FAMILY_EXPR, all_depths_of_family, family_of_batch, family_partitions,
                                    power_partitions)
from fear_assets.simulation.batches import batch_keys_of
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.core.settings import depth_key


def _power_dir(protocol: ProtocolResource) -> Path:
    return Path(protocol.cache_dir).parent / "power"


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
    of the positive controls, and (a registered family) H4's model on the pilot probe and H5's
    probit on the pilot's forced choices."""

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    band = band_keys(stored_band(pilot_depths))
    rows = pilot_scores[pilot_scores["block"] == "pilot_primary"]
    fears_of = {i: bank.item(i).group for i in set(rows["item_id"])}
    table = model_table(unmask_pilot(rows, assignment_key), sentence_surprisal, fears_of,
                        settings.neutral_partner_option)
    fit = fit_cells(fitter_for(settings, family_key), table, settings.fears, band,
                    derived_seed(settings.master_seed, "power_pilot_estimates", family_key) % (2**31), "pilot_primary")
    controls = {str(r.control): (0.0 if pd.isna(r.mean) else float(r.mean)) for r in pilot_controls.itertuples()}
    est = pilot_estimates(fit.idata, fit.data, controls)
    if settings.family(family_key).role != "embedded":  # H4's and H5's models at the pilot (the demo fits neither)
        s = sampler_of(settings, family_key)
        removed = pilot_scores[pilot_scores["block"] == "pilot_content_removed"]  # the criterion's baseline (4.5)
        h5_rows = h5_pilot_rows(unmask_pilot(rows, assignment_key), depth_key(int(pilot_depths['h5_depth'].iloc[0])),
                                unmask_pilot(removed, assignment_key) if len(removed) else None)
        h5 = h5_pilot_estimates(h5_rows, H5Priors.from_settings(settings), s.draws, s.tune,
                                s.chains, derived_seed(settings.master_seed, "power_pilot_h5", family_key) % 2**31)
        probe = unmask_pilot(pilot_probe_outputs[pilot_probe_outputs["frame_set"] == "pilot"], assignment_key)
        h4_table = h4_data(probe, sentence_surprisal, {i: bank.item(i).group for i in set(probe["item_id"])},
                           settings.neutral_partner_option)
        h4 = h4_pilot_fit(h4_table, settings.fears, Priors.from_settings(settings), s.draws, s.tune,
                          s.chains, derived_seed(settings.master_seed, "power_pilot_h4", family_key) % 2**31)
        est = dataclasses.replace(est, h4=h4, h5=h5.as_dict())
    out = pd.DataFrame([{"family": family_key, "estimates_json": json.dumps(est.as_dict(), sort_keys=True),
                         "band": ",".join(band), "pilot_trials": len(table), "max_rhat": fit.diagnostics["max_rhat"]}])
    return dg.Output(out, metadata={"band": ",".join(band), "pilot trials": len(table),
                                    "sigma": round(est.sigma, 4), "unit sd": round(est.unit_sd, 4),
                                    "frame sds": ", ".join(f"{x:.3f}" for x in est.frame_sd),
                                    "controls (pilot means)": json.dumps({k: round(v, 3) for k, v in controls.items()})})


#: Each batch step samples 2 chains (one per core). Pool "power" bounds how many run at once on
#: one machine (`dagster instance concurrency set power <cores / 2>`); under the Kubernetes
#: executor each step is its own pod with these requests (deploy/kubernetes/power.md).
POWER_OP_TAGS = {"dagster-k8s/config": {"container_config": {"resources": {
    "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}}}}


@dg.asset(partitions_def=power_partitions, kinds={"pymc", "parquet"}, pool="power",
          op_tags=POWER_OP_TAGS,
          ins={"power_pilot_estimates": dg.AssetIn(partition_mapping=family_of_batch)})
def power_simulation(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                     power_pilot_estimates: pd.DataFrame) -> dg.MaterializeResult:
    """6.3: one batch of simulated datasets on the registered design at its frame count, each
    fitted under exactly the registered priors (compiled once per shape and process, data
    swapped per dataset); labels, HDIs and every fit's R-hat, ESS and divergences go to one
    Parquet file. A batch whose file exists is finished and is not refitted."""

    settings = protocol.settings()
    keys = context.partition_key.keys_by_dimension
    family_key, key = keys["family"], keys[BATCH]
    if key not in batch_keys_of(settings, family_key):
        raise ValueError(f"batch {key} is not part of family {family_key}'s simulation "
                         f"(its batches: {batch_keys_of(settings, family_key)[:3]} ...): pick one of those")
    scenario, frames, batch = parse_batch_key(key)
    path = batch_path(_power_dir(protocol), family_key, key, run_key(settings, family_key, power_pilot_estimates))
    if path.exists():
        context.log.info(f"{key}: finished earlier ({path}); not refitted")
        return dg.MaterializeResult(metadata={"path": str(path), "resumed": True})
    p = settings.power
    family = settings.family(family_key)
    total = p.demo.datasets if family.role == "embedded" else p.datasets
    size = p.batch_size
    datasets = range(batch * size, min(total, (batch + 1) * size))
    est = PilotEstimates.from_dict(json.loads(power_pilot_estimates["estimates_json"].iloc[0]))
    band = str(power_pilot_estimates["band"].iloc[0]).split(",")
    design = simulated_design(settings, family.depth_keys, band, frames, est.covariate_sd,
                              dataset_seed(settings.master_seed, family_key, "design", frames, 0, "covariates"))
    fitter = fitter_for(settings, family_key)
    t = time.perf_counter()
    blocks = p.demo.blocks if family.role == "embedded" else tuple(PRIMARY_MODEL_BLOCKS)
    labels = run_batch(fitter, design, est, Rules.from_settings(settings), family_key, scenario, datasets,
                       settings.master_seed, log=context.log.info, blocks=blocks)
    write_batch(path, labels)
    return dg.MaterializeResult(metadata={
        "path": str(path), "datasets": len(datasets), "rows (trials per block)": design.rows,
        "seconds": round(time.perf_counter() - t, 1), "compilations (this process)": fitter.compilations,
        "frame effects sampled (registered rule, per dataset; same prior either way)": dg.MetadataValue.json(
            labels.drop_duplicates(["dataset", "frame_parametrisation"])["frame_parametrisation"].dropna()
            .value_counts().to_dict()),
        "fits missing the convergence rule": int((~labels["converged"]).sum()),
        "label frequencies (plot)": metadata_image(report_plots.label_frequency_plot(labels),
                                                                "power simulation label frequencies"),
        "labels": dg.MetadataValue.md(labels.groupby(["contrast", "label"]).size().rename("datasets")
                                      .reset_index().to_markdown(index=False)),
        "demo": family.role == "embedded"})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "json"}, deps=[power_simulation])
def power_summary(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                  power_pilot_estimates: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.3: label frequencies per hypothesis, scenario and frame count with Monte Carlo SEs,
    every registered target, the frame count (blocks of 10 up to 100), the hypotheses declared
    estimation-only and the traced source of a joint shortfall; written to the registration
    record's power section. The embedded family's figures are a reduced demo, NOT the
    registered simulation."""

    settings = protocol.settings()
    family_key = context.partition_key
    family = settings.family(family_key)
    directory = _power_dir(protocol) / family_key / run_key(settings, family_key, power_pilot_estimates)
    labels = read_batches(directory)
    t = PowerTargets.from_settings(settings)
    demo = family.role == "embedded"
    if demo:  # the reduced demo runs at its own frame count only
        frames = settings.power.demo.frames
        t = PowerTargets(**{**t.__dict__, "frames_start": frames, "frames_max": frames})
    if labels.empty:
        raise ValueError(f"no finished power batches under {directory}: materialise power_simulation for "
                         f"family {family_key} first (a backfill over its batch partitions)")
    decision = decide(labels, t, NOT_SIMULATED)
    freq = label_frequencies(labels)
    expected = len(batch_keys_of(settings, family_key))
    section = {"demo": demo, "note": ("REDUCED DEMO SIMULATION, NOT the registered simulation: "
                                      f"{settings.power.demo.as_written()}") if demo else "",
               "datasets_fitted": int(labels.groupby(["scenario", "frames"])["dataset"].nunique().sum()),
               "fits_missing_convergence_rule": int((~labels["converged"].astype(bool)).sum()),
               "frame_parametrisation": frame_forms_record(settings.fitting.frame_parametrisation, labels),
               "fits": int(len(labels)),
               "batches_found": int(len(list(directory.glob('*.parquet')))), "batches_registered": expected,
               **{k: v for k, v in decision.items() if k != "targets"},
               "targets": decision["targets"],
               "label_frequencies": freq.to_dict(orient="records")}
    path = write_power_section(protocol.registration_dir, family_key, section)
    table = pd.DataFrame(decision["targets"]).assign(family=family_key, demo=demo, power_json=str(path))
    context.log.info(f"power gate {family_key}: {decision['status']}; frames {decision['frames']}; "
                     f"estimation-only {decision['estimation_only'] or 'none'}")
    shown = table[["target", "frames", "rate", "mcse", "n", "bound", "met", "note"]].copy()
    shown[["rate", "mcse"]] = shown[["rate", "mcse"]].round(3)
    return dg.Output(table, metadata={
        "status": decision["status"], "frames": str(decision["frames"]), "demo (not registered)": demo,
        "estimation-only": ", ".join(decision["estimation_only"]) or "none",
        "joint shortfall source": str(decision["joint_shortfall_source"]),
        "gates underpowered": decision["gates_underpowered"],
        "targets": dg.MetadataValue.md(shown.to_markdown(index=False))})


@dg.asset_check(asset=power_summary, blocking=GATES_BLOCK, description=(
    "6.3: every registered target of the power simulation is met (a target whose component is "
    "not simulated counts as not met)."))
def power_targets_met(power_summary: pd.DataFrame) -> dg.AssetCheckResult:
    missed = power_summary[power_summary["met"] != True]  # noqa: E712 (None: not computable)
    frames = sorted(power_summary["frames"].unique())
    demo = bool(power_summary["demo"].iloc[0]) if len(power_summary) else False
    return dg.AssetCheckResult(
        passed=missed.empty,
        metadata={"missed or not computable": len(missed), "frames examined": ", ".join(map(str, frames)),
                  "demo (not registered)": demo},
        description=("all registered targets met" if missed.empty else
                     f"{len(missed)} target(s) missed or not computable, e.g. {missed['target'].iloc[0]}: "
                     "add frames (the next block of 10) and simulate it, or declare the hypothesis "
                     "estimation-only at 100 frames (6.3)" + (" [reduced demo, not the registered simulation]"
                                                               if demo else "")))
