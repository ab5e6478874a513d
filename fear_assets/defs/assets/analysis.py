"""Stage "analysis" (protocol 6.1-6.2; D3-D4): H4 on probe log-odds and every registered
estimand, fitted on masked data and unmasked only once scoring is locked (D6)."""

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd

from fear_assets.analysis.confirmatory import Inputs, Registered, run
from fear_assets.models.data import PILOT_FALLBACK_NOTE, analysed_rows
from fear_assets.analysis.gate_c import GateCPriors
from fear_assets.analysis.h4 import fit_h4, h4_data, h4_declared, h4_flags, h4_label
from fear_assets.models.h5_model import H5Priors
from fear_assets.analysis.plots import delta_by_depth_plot, forest_plot, markdown_image
from fear_assets.models.primary_model import Priors
from fear_assets.analysis.unmasking import unmask
from fear_assets.defs.assets.steps import fitter as registered_fitter
from fear_assets.defs.assets.steps import readable_markdown
from fear_assets.core.hashing import derived_seed, sha256_file, write_inference_data
from fear_assets.pilot.surprisal import require_same_names
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.registration.gates import declared_estimation_only
from fear_assets.reading.inputs import apply_estimation_only, convergence_split, estimand_flags, h4_estimand_row
from fear_assets.registration.freeze import read_record
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.core.settings import depth_key

BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)
NOT_CONVERGED_NEXT = ("What to change: more tuning and draws (settings: sampler), or more frames where frame effects "
                      "are not identified (one pilot frame cannot separate them from the intercept); never read a "
                      "label that did not converge.")


def _record(registration_record: pd.DataFrame) -> dict:
    return json.loads(registration_record["record_json"].iloc[0])


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "pymc"},
          ins={"confirmatory_scores": BY_DEPTH, "pilot_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
def h4_posterior(context: dg.AssetExecutionContext, protocol: ProtocolResource, probe_outputs: pd.DataFrame,
                 probe_controls: pd.DataFrame, pilot_probe_outputs: pd.DataFrame, pilot_probe_controls: pd.DataFrame,
                 registration_record: pd.DataFrame, sentence_surprisal: pd.DataFrame,
                 confirmatory_scores: pd.DataFrame, pilot_scores: pd.DataFrame,
                 assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """H4, carriage (protocol 6.1): "the primary model on probe log-odds, both content
    versions of each document entered separately, with an option term and a document
    intercept"; the H2 contrast on that scale averaged over the registered band depths;
    99% HDI and the decision rule. Fitted on masked codes; the assignment key is joined only
    once scoring is locked. Where the design probes no confirmatory frame (the embedded
    demo) the pilot's probe is read, descriptive; the flags say whether H4 is
    uninterpretable (controls) or estimation-only (ceiling)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    scores, frame_set = analysed_rows(confirmatory_scores, pilot_scores)
    outputs, controls = (probe_outputs, probe_controls) if frame_set == "confirmatory" else \
        (pilot_probe_outputs, pilot_probe_controls)
    outputs = unmask(outputs, assignment_key, list(family.depth_keys), scores, read_record(protocol.registration_dir))
    record = _record(registration_record)
    band = record["depth_band"]
    data = h4_data(outputs, sentence_surprisal, {i: bank.item(i).group for i in outputs["item_id"].unique()},
                   settings.neutral_partner_option)
    s = settings.sampler
    fit = fit_h4(data, settings.fears, band, Priors.from_settings(settings), s.draws, s.tune, s.chains,
                 derived_seed(settings.master_seed, "h4", family_key, frame_set) % (2**31),
                 settings.decision.hdi_prob, settings.decision.sesoi)
    path = Path(protocol.cache_dir).parent / "posteriors" / family_key / f"h4_{frame_set}.nc"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_inference_data(fit.idata, path)
    # 6.1's rules are flags on H4's row: the ceiling comes from the record (declared before
    # collection), the control probes from the analysed frame set and the pilot.
    interpretable, estimation_only = h4_declared(controls[controls["frame_set"] == frame_set], record)
    flags = h4_flags(fit.diagnostics, settings.convergence, interpretable, estimation_only,
                     frame_set, data["frame"].nunique())
    reported = h4_label(fit.label, interpretable, estimation_only)
    table = pd.DataFrame([{
        "family": family_key, "frame_set": frame_set, "hypothesis": "H4", "mean": fit.mean, "hdi_low": fit.hdi_low,
        "hdi_high": fit.hdi_high, "label": reported,
        "practically_meaningful": fit.practically_meaningful and reported == fit.label,
        "band_depths": ",".join(depth_key(b) for b in band), "documents": len(data), **fit.diagnostics,
        "flags": "; ".join(flags), "draws_file": str(path), "draws_sha256": sha256_file(path)}])
    context.log.info(f"H4 {frame_set}: mean {fit.mean:.3f}, 99% HDI [{fit.hdi_low:.3f}, {fit.hdi_high:.3f}] "
                     f"-> {reported}")
    return dg.Output(table, metadata={
        "H4": dg.MetadataValue.md(readable_markdown(table[["frame_set", "mean", "hdi_low", "hdi_high", "label",
                                                           "max_rhat", "min_ess_bulk", "divergences", "flags"]])),
    })


@dg.asset_check(asset=h4_posterior, blocking=False, description=(
    "Convergence of the H4 fit (6.1): R-hat <= 1.01, bulk and tail ESS >= 400 for the reported "
    "contrast's parameters, no divergences (registered under 'convergence'). A warning in either "
    "mode, never blocking: H4 does not change the reading (6.2), so a non-converged H4 is a "
    "flag on its own row (its label not to be read), never a stop on H2, H5 or the reading."))
def h4_converged(h4_posterior: pd.DataFrame) -> dg.AssetCheckResult:
    bad = h4_posterior[h4_posterior["flags"].str.contains("NOT CONVERGED")]
    return dg.AssetCheckResult(
        passed=bad.empty, severity=dg.AssetCheckSeverity.WARN,
        description="converged" if bad.empty else
        "not converged: " + " | ".join(f"{r.frame_set}: {r.flags}" for r in bad.itertuples()) +
        ". What to change: more tuning and draws, more frames (one frame cannot separate frame effects from the "
        "intercept), or, where the outcome is constant (probe at the clip), nothing: H4 is estimation-only.",
        metadata={"diagnostics": dg.MetadataValue.md(h4_posterior[["frame_set", "max_rhat", "min_ess_bulk",
                                                                   "min_ess_tail", "divergences"]].to_markdown(index=False))},
    )


def _registered(settings, embedded: bool = False) -> Registered:
    d, s, pc = settings.decision, settings.sampler, settings.positive_controls
    return Registered(hdi_prob=d.hdi_prob, sesoi=d.sesoi, meaningful=d.meaningful,
                      sensitivity_sd=settings.priors.sensitivity_fixed_effect_sd,
                      convergence=settings.convergence, flag_rate=settings.exclusion.cell_flag_rate,
                      control_min_mean=pc.pass_min_mean, control_hdi_above=pc.hdi_above,
                      draws=s.draws, tune=s.tune, chains=s.chains,
                      convergence_remedy=settings.fitting.convergence_remedy.for_family(embedded))


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "pymc"},
          ins={"confirmatory_scores": BY_DEPTH, "pilot_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
def posteriors(context: dg.AssetExecutionContext, protocol: ProtocolResource, confirmatory_scores: pd.DataFrame,
               pilot_scores: pd.DataFrame, assignment_key: pd.DataFrame, sentence_surprisal: pd.DataFrame,
               judge_sentence_surprisal: pd.DataFrame, registration_record: pd.DataFrame,
               pilot_controls: pd.DataFrame, h4_posterior: pd.DataFrame, base_sentence_surprisal: pd.DataFrame,
               report_scoring: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Every registered estimand of one configuration (5, 6.1-6.2; D3, D4): H1-H3 as
    band-averaged posterior contrasts of the primary model (Student-t, sum-to-zero fixed
    effects, LKJ(2) frame slopes, unit intercepts; nutpie), H5 from the hierarchical probit
    at the H5 depth, H4 from ``h4_posterior``, gates (a)-(c), the positive controls, and the
    secondary and sensitivity estimands. Each row carries its 99% HDI, label and its own
    R-hat/ESS. Fitted on masked data: "the assignment key is joined only once scoring is
    locked". The depth band, H5 depth and pilot sigma come from the registration record,
    never from these data. A reduced design without confirmatory scores reads the pilot's
    (descriptive, flagged)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    record = _record(registration_record)
    # The covariates must come from the names the documents carry (4.2, 4.3).
    require_same_names(sentence_surprisal, record["selected_names"], "posteriors")
    scores, frame_set = analysed_rows(confirmatory_scores, pilot_scores)
    unmasked = unmask(scores, assignment_key, list(family.depth_keys), scores, read_record(protocol.registration_dir))
    prefix = "" if frame_set == "confirmatory" else "pilot_"
    band = [depth_key(d) for d in record["depth_band"]]
    registered = _registered(settings, family.role == "embedded")
    fitter = registered_fitter(settings)
    inputs = Inputs(
        scores=unmasked, surprisal=sentence_surprisal, fears_of={i: bank.item(i).group for i in unmasked["item_id"].unique()},
        fears=settings.fears, neutral_option=settings.neutral_partner_option, band=band,
        h5_depth=depth_key(record["h5_depth"]), pilot_sigma=float(record["pilot_sigma"]),
        pilot_sigma_judge=record.get("pilot_sigma_judge"),
        depth_tokens={k: family.tokens_at(family.depth_index(k)) for k in family.depth_keys}, prefix=prefix,
        registered=registered,
        seed=lambda name: derived_seed(settings.master_seed, "posteriors", family_key, name) % (2**31),
        bank=bank, topic_counts_path=Path(protocol.cache_dir).parent / "topic_counts.csv",
        pilot_controls=pilot_controls, h5_priors=H5Priors.from_settings(settings),
        gate_c_priors=GateCPriors.from_settings(settings), log=context.log.info,
        judge_surprisal=judge_sentence_surprisal if len(judge_sentence_surprisal) else None,
        base_surprisal=base_sentence_surprisal if len(base_sentence_surprisal) else None,
        matching_tolerance=settings.matching.max_abs_difference, reports=report_scoring)
    result = run(inputs, fitter)
    table = pd.concat([pd.DataFrame(result.rows), pd.DataFrame([h4_estimand_row(h4_posterior.iloc[0])])],
                      ignore_index=True)
    # 6.3: a hypothesis declared estimation-only before collection keeps its interval, not its label.
    table = apply_estimation_only(table, declared_estimation_only(record))
    directory = Path(protocol.cache_dir).parent / "posteriors" / family_key
    directory.mkdir(parents=True, exist_ok=True)
    draws_path, primary_path = directory / "contrasts.npz", directory / "primary.nc"
    np.savez(draws_path, **result.draws)
    write_inference_data(result.fits["primary"].idata, primary_path)
    flags = estimand_flags(record, frame_set == "pilot", family.stand_in, PILOT_FALLBACK_NOTE)
    table = table.assign(family=family_key, frame_set=frame_set, band_depths=",".join(band),
                         h5_depth=depth_key(record["h5_depth"]),
                         converged=table["convergence_problems"].fillna("") == "",
                         failed_gates="; ".join(flags), draws_file=str(draws_path),
                         draws_sha256=sha256_file(draws_path), primary_file=str(primary_path),
                         primary_sha256=sha256_file(primary_path))
    table["practically_meaningful"] = table["practically_meaningful"].fillna(False).astype(bool)
    forest_rows = table[table["kind"].isin(["confirmatory", "gate"]) & (table["status"] == "estimated")]
    forest = forest_plot(forest_rows.set_index("contrast")[["mean", "hdi_low", "hdi_high", "label", "converged"]].reset_index(),
                         settings.decision.rope, settings.decision.hdi_prob,
                         f"{family_key}: H1-H5 and gates (99% HDI, ROPE shaded)")
    depth_png = delta_by_depth_plot(result.by_depth)
    (directory / "forest.png").write_bytes(forest)
    (directory / "delta_by_depth.png").write_bytes(depth_png)
    shown = table[["contrast", "kind", "status", "mean", "hdi_low", "hdi_high", "label", "rhat", "ess_bulk",
                   "convergence_problems"]]
    return dg.Output(table, metadata={
        "estimands": dg.MetadataValue.md(readable_markdown(shown)),
        "forest plot": dg.MetadataValue.md(markdown_image(forest, "forest plot of H1-H5 and the gates")),
        "Delta by depth": dg.MetadataValue.md(markdown_image(depth_png, "Delta by depth for the six cells")),
        "plots (PNG files)": dg.MetadataValue.path(str(directory)),
        "frame set": "pilot (descriptive; reuses the reduced design's pilot scores)" if prefix else "confirmatory",
        "flags": "; ".join(flags) or "none", "model compilations": fitter.compilations,
        "exclusions by cell (4.8)": dg.MetadataValue.md(
            result.exclusions.to_markdown(index=False) if result.exclusions is not None else "none"),
        "draws": f"{draws_path} (sha256 {sha256_file(draws_path)[:12]})",
        "frame effects sampled (registered rule, per fit)": dg.MetadataValue.json(
            {name: fit.frames for name, fit in result.fits.items() if getattr(fit, "frames", None)}),
        "convergence remedy runs": dg.MetadataValue.md(readable_markdown(pd.DataFrame(result.extensions))
                                                       if result.extensions else "none"),
    })


@dg.asset_check(asset=posteriors, blocking=GATES_BLOCK, description=(
    "Convergence of every reported contrast (6.1): R-hat <= 1.01, bulk and tail ESS >= 400, "
    "no divergences. Blocks (confirmatory mode) only on the estimands that can stop the "
    "reading: H1-H3, H5, the gates and the controls; H4 (6.2: it never changes the reading) "
    "and a secondary or sensitivity contrast that misses the rule are a warning and a flag."))
def posteriors_converged(posteriors: pd.DataFrame) -> dg.AssetCheckResult:
    estimated = posteriors[(posteriors["status"] == "estimated") & posteriors["rhat"].notna()]
    blocking, flagged = convergence_split(estimated)
    listed = lambda bad: " | ".join(f"{r.contrast}: {r.convergence_problems}" for r in bad.itertuples())
    parts = []
    if len(blocking):
        parts.append("not converged (H1-H3, H5, gates, controls): " + listed(blocking) + ". " + NOT_CONVERGED_NEXT)
    if len(flagged):
        parts.append("H4/secondary/sensitivity not converged (flagged, cannot change the reading): " + listed(flagged))
    return dg.AssetCheckResult(
        passed=not parts, severity=dg.AssetCheckSeverity.ERROR if len(blocking) else dg.AssetCheckSeverity.WARN,
        description="every reported contrast converged" if not parts else " ".join(parts),
        metadata={"diagnostics": dg.MetadataValue.md(readable_markdown(
            estimated[["contrast", "kind", "rhat", "ess_bulk", "ess_tail", "divergences"]]))})
