"""Stage "analysis" (protocol 6.1-6.2): the H4 analysis on probe log-odds.

The remaining confirmatory models (H1-H3 on Delta, H5, the gates, the controls, the
secondary estimands) come with the analysis issue; the primary model they use is
``fear_assets.analysis.primary_model``.
"""

import json
from pathlib import Path

import arviz as az
import dagster as dg
import numpy as np
import pandas as pd

import fear_assets
from fear_assets.analysis.primary_model import (Priors, build_model, cell_means, convergence, hypotheses,
                                                posterior_draws, prepare, sample)
from fear_assets.analysis.unmasking import unmask
from fear_assets.lm.surprisal import require_same_names
from fear_assets.hashing import derived_seed, sha256_file
from fear_assets.modes import GATES_BLOCK
from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.reading.inputs import convergence_split, reading_inputs
from fear_assets.reading.inputs import cross_family_statement as cross_family_statement_of
from fear_assets.registration.freeze import read_record
from fear_assets.resources.protocol import ProtocolResource

GROUP = "analysis"


def convergence_problems(diag: dict, rule: dict) -> list[str]:
    out = []
    if diag["max_rhat"] > rule["rhat_max"]:
        out.append(f"R-hat {diag['max_rhat']:.3f} > {rule['rhat_max']}")
    if diag["min_ess_bulk"] < rule["ess_bulk_min"]:
        out.append(f"bulk ESS {diag['min_ess_bulk']:.0f} < {rule['ess_bulk_min']}")
    if diag["min_ess_tail"] < rule["ess_tail_min"]:
        out.append(f"tail ESS {diag['min_ess_tail']:.0f} < {rule['ess_tail_min']}")
    if diag["divergences"] > rule["divergences_max"]:
        out.append(f"{diag['divergences']} divergences")
    return out


def h4_data(outputs: pd.DataFrame, surprisal: pd.DataFrame, bank, neutral_option: int) -> pd.DataFrame:
    """Model table of H4: one row per probed document version, with the registered
    covariates (agent sentence's name NLL; rest NLL minus the partner's), centred on their
    bank means (D3b, as every fit of the primary model)."""
    from fear_assets.analysis.data import covariate_centres, sentence_covariates

    d = outputs.rename(columns={"fold_rotation": "rotation", "content_option": "option"}).copy()
    d = d.merge(sentence_covariates(surprisal, neutral_option), on=["item_id", "rotation", "agent", "content", "option"],
                how="left")
    for cov, centre in covariate_centres(surprisal, neutral_option).items():
        d[cov] = d[cov] - centre
    d["depth"] = "d" + d["depth_index"].astype(str)
    d["frame"] = d["item_id"]
    d["fear"] = [bank.item(i).group for i in d["item_id"]]
    d["unit"] = d["item_id"] + "|r" + d["rotation"].astype(str) + "|o" + d["order"].astype(str) + "|" + d["depth"]
    d["document"] = d["unit"] + "|" + d["condition_code"]
    return d


@dg.asset(
    group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
    kinds={"duckdb", "pymc"},
    ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
         "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)},
)
def h4_posterior(context: dg.AssetExecutionContext, protocol: ProtocolResource, probe_outputs: pd.DataFrame,
                 probe_controls: pd.DataFrame, pilot_depths: pd.DataFrame, sentence_surprisal: pd.DataFrame,
                 scores: pd.DataFrame, assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """H4, carriage (protocol 6.1): the primary model on probe log-odds, both content
    versions of each document entered separately, with an option term and a document
    intercept; the H2 contrast on that scale averaged over the band depths; 99% HDI and the
    decision rule. Fitted on masked codes; the assignment key is joined only once scoring is
    locked. The embedded family has probe documents for its pilot frame only, so its H4 is
    descriptive; the flags say whether H4 is uninterpretable (controls) or estimation-only
    (ceiling)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    frozen = read_record(protocol.registration_dir)
    outputs = unmask(probe_outputs, assignment_key, list(family.depth_keys), scores, frozen)
    rows = []
    for frame_set, part in outputs.groupby("frame_set"):
        data = h4_data(part, sentence_surprisal, bank, int(settings.design["neutral_partner_option"]))
        present = lambda col: sorted(data[col].unique(), key=str)
        levels = {"agent": ["self", "peer", "person"], "content": ["threat", "harmless"],
                  "depth": present("depth"), "order": present("order"), "option": present("option"),
                  "rotation": present("rotation"), "fear": [f for f in settings.fears if f in set(data["fear"])]}
        d = prepare(data, levels, outcome="log_odds", document="document")
        seed = derived_seed(settings.master_seed, "h4", family_key, frame_set) % (2**31)
        sampler = settings.section("sampler")
        idata = sample(build_model(d, Priors.from_settings(settings)), int(sampler["draws"]), int(sampler["tune"]),
                       int(sampler["chains"]), seed)
        # A band depth without probe documents is an error (MissingBandDepthError), not a smaller band.
        band = [f"d{b}" for b in pilot_depths["depth_band"].iloc[0].split(",")]
        mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), band)
        h4 = hypotheses(mu)["H2"]
        low, high = az.hdi(h4, hdi_prob=settings.decision["hdi_prob"])
        decision = fear_assets.label(float(low), float(high), settings.decision["sesoi"])
        diag = convergence(idata)
        path = Path(protocol.cache_dir).parent / "posteriors" / family_key / f"h4_{frame_set}.nc"
        path.parent.mkdir(parents=True, exist_ok=True)
        idata.to_netcdf(str(path))
        ctrl = probe_controls[probe_controls["frame_set"] == frame_set]
        flags = []
        problems = convergence_problems(diag, settings.section("convergence"))
        if problems:
            flags.append("NOT CONVERGED (" + "; ".join(problems) + "): the label is not to be read")
        if not bool(ctrl["h4_interpretable"].iloc[0]):
            flags.append("H4 uninterpretable: a control probe decodes away from chance")
        if "h4_estimation_only" in ctrl and bool(ctrl["h4_estimation_only"].fillna(False).iloc[0]):
            flags.append("H4 estimation-only: probe accuracy above the ceiling at the band depths")
        if frame_set == "pilot":
            flags.append(f"pilot frames only ({data['frame'].nunique()}): descriptive")
        rows.append({"family": family_key, "frame_set": frame_set, "hypothesis": "H4", "mean": float(h4.mean()),
                     "hdi_low": float(low), "hdi_high": float(high), "label": decision.label,
                     "practically_meaningful": decision.practically_meaningful, "band_depths": ",".join(band),
                     "documents": len(data), **diag, "flags": "; ".join(flags), "draws_file": str(path),
                     "draws_sha256": sha256_file(path)})
        context.log.info(f"H4 {frame_set}: mean {h4.mean():.3f}, 99% HDI [{low:.3f}, {high:.3f}] -> {decision.label}")
    table = pd.DataFrame(rows)
    return dg.Output(table, metadata={
        "H4": dg.MetadataValue.md(table[["frame_set", "mean", "hdi_low", "hdi_high", "label", "max_rhat",
                                         "min_ess_bulk", "divergences", "flags"]].round(4).to_markdown(index=False)),
    })


@dg.asset_check(asset=h4_posterior, blocking=GATES_BLOCK, description=(
    "Convergence of the H4 fit: R-hat <= 1.01, bulk and tail ESS >= 400 for the reported "
    "contrast's parameters, no divergences (registered under 'convergence'). Blocking in "
    "confirmatory mode; in pilot mode the label carries the failure."))
def h4_converged(h4_posterior: pd.DataFrame) -> dg.AssetCheckResult:
    bad = h4_posterior[h4_posterior["flags"].str.contains("NOT CONVERGED")]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="converged" if bad.empty else
        "not converged: " + " | ".join(f"{r.frame_set}: {r.flags}" for r in bad.itertuples()) +
        ". What to change: more tuning and draws, more frames (one frame cannot separate frame effects from the "
        "intercept), or, where the outcome is constant (probe at the clip), nothing: H4 is estimation-only.",
        metadata={"diagnostics": dg.MetadataValue.md(h4_posterior[["frame_set", "max_rhat", "min_ess_bulk",
                                                                   "min_ess_tail", "divergences"]].to_markdown(index=False))},
    )


# ---------------------------------------------------------------------------------------
# The confirmatory analysis and the Section 8 reading (6.1-6.2, 8; D3-D5)
# ---------------------------------------------------------------------------------------
def _registered(settings) -> "Registered":
    from fear_assets.analysis.confirmatory import Registered

    pc, sampler = settings.section("positive_controls"), settings.section("sampler")
    return Registered(hdi_prob=float(settings.decision["hdi_prob"]), sesoi=float(settings.decision["sesoi"]),
                      meaningful=float(settings.decision["meaningful"]),
                      sensitivity_sd=float(settings.section("priors")["sensitivity_fixed_effect_sd"]),
                      convergence=settings.section("convergence"),
                      flag_rate=float(settings.section("exclusion")["cell_flag_rate"]),
                      control_min_mean=float(pc["pass_min_mean"]), control_hdi_above=float(pc["hdi_above"]),
                      draws=int(sampler["draws"]), tune=int(sampler["tune"]), chains=int(sampler["chains"]))


def _record(registration_record: pd.DataFrame) -> dict:
    return json.loads(registration_record["record_json"].iloc[0])


@dg.asset(
    group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
    kinds={"duckdb", "pymc"},
    ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
         "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)},
)
def posteriors(context: dg.AssetExecutionContext, protocol: ProtocolResource, scores: pd.DataFrame,
               assignment_key: pd.DataFrame, sentence_surprisal: pd.DataFrame,
               judge_sentence_surprisal: pd.DataFrame, registration_record: pd.DataFrame,
               pilot_controls: pd.DataFrame, h4_posterior: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Every registered estimand of one configuration (5, 6.1-6.2; D3, D4): H1-H3 as
    band-averaged posterior contrasts of the primary model (Student-t, sum-to-zero fixed
    effects, LKJ(2) frame slopes, unit intercepts; nutpie), H5 from the hierarchical probit
    at the H5 depth, H4 from ``h4_posterior``, gates (a)-(c), the positive controls, and the
    secondary and sensitivity estimands (recall, summed and first-person Delta, prior
    sensitivity, role-play, base checkpoint, frequentist mixed model, mediation, covariates,
    exclusions, five-fear breakdown, classes, protective choice). Each row carries its 99%
    HDI, label and its own R-hat/ESS. Fitted on masked data: the assignment key is joined
    only once scoring is locked. Draws are stored as files (sha256 in the table). The depth
    band, H5 depth and pilot sigma come from the registration record, never from these data."""
    from fear_assets.analysis.confirmatory import Inputs, run
    from fear_assets.analysis.gate_c import GateCPriors
    from fear_assets.analysis.h5_model import H5Priors
    from fear_assets.analysis.plots import delta_by_depth_plot, forest_plot, markdown_image

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    record = _record(registration_record)
    # The covariates must come from the names the documents carry (4.2, 4.3).
    require_same_names(sentence_surprisal, record["selected_names"], "posteriors")
    frozen = read_record(protocol.registration_dir)
    unmasked = unmask(scores, assignment_key, list(family.depth_keys), scores, frozen)
    prefix = "" if (unmasked["block"] == "primary").any() else "pilot_"
    band = [f"d{d}" for d in record["depth_band"]]
    fitter_settings = _registered(settings)
    from fear_assets.analysis.primary_model import Fitter

    fitter = Fitter(Priors.from_settings(settings), fitter_settings.draws, fitter_settings.tune, fitter_settings.chains)
    inputs = Inputs(
        scores=unmasked, surprisal=sentence_surprisal, fears_of={i: bank.item(i).group for i in unmasked["item_id"].unique()},
        fears=settings.fears, neutral_option=int(settings.design["neutral_partner_option"]), band=band,
        h5_depth=f"d{record['h5_depth']}", pilot_sigma=float(record["pilot_sigma"]),
        pilot_sigma_judge=record.get("pilot_sigma_judge"),
        depth_tokens={k: family.tokens_at(family.depth_index(k)) for k in family.depth_keys}, prefix=prefix,
        registered=fitter_settings,
        seed=lambda name: derived_seed(settings.master_seed, "posteriors", family_key, name) % (2**31),
        bank=bank, topic_counts_path=Path(protocol.cache_dir).parent / "topic_counts.csv",
        pilot_controls=pilot_controls, h5_priors=H5Priors.from_settings(settings),
        gate_c_priors=GateCPriors.from_settings(settings), log=context.log.info,
        judge_surprisal=judge_sentence_surprisal if len(judge_sentence_surprisal) else None)
    result = run(inputs, fitter)
    table = pd.DataFrame(result.rows)
    h4 = h4_posterior.iloc[0]
    table = pd.concat([table, pd.DataFrame([{
        "contrast": "H4", "kind": "confirmatory", "status": "estimated", "scale": "probe log-odds",
        "mean": h4["mean"], "hdi_low": h4["hdi_low"], "hdi_high": h4["hdi_high"], "label": h4["label"],
        "practically_meaningful": bool(h4["practically_meaningful"]), "rhat": h4["max_rhat"],
        "ess_bulk": h4["min_ess_bulk"], "ess_tail": h4["min_ess_tail"], "divergences": h4["divergences"],
        "note": f"from h4_posterior: {h4['flags']}", "convergence_problems":
            "see h4_posterior" if "NOT CONVERGED" in str(h4["flags"]) else ""}])], ignore_index=True)
    directory = Path(protocol.cache_dir).parent / "posteriors" / family_key
    directory.mkdir(parents=True, exist_ok=True)
    draws_path = directory / "contrasts.npz"
    np.savez(draws_path, **result.draws)
    primary_path = directory / "primary.nc"
    result.fits["primary"].idata.to_netcdf(str(primary_path))
    flags = list(record["failed_gates"])
    if prefix == "pilot_":
        flags.append("pilot frames only: descriptive (the reduced design scores no confirmatory block)")
    if family.stand_in:
        flags.append("stand-in scorer/judge")
    table = table.assign(family=family_key, frame_set="pilot" if prefix else "confirmatory",
                         band_depths=",".join(band), h5_depth=f"d{record['h5_depth']}",
                         converged=table["convergence_problems"].fillna("") == "",
                         failed_gates="; ".join(flags), draws_file=str(draws_path),
                         draws_sha256=sha256_file(draws_path), primary_file=str(primary_path),
                         primary_sha256=sha256_file(primary_path))
    table["practically_meaningful"] = table["practically_meaningful"].fillna(False).astype(bool)
    forest_rows = table[table["kind"].isin(["confirmatory", "gate"]) & (table["status"] == "estimated")]
    rope = tuple(settings.decision["rope"])
    forest = forest_plot(forest_rows.set_index("contrast")[["mean", "hdi_low", "hdi_high", "label", "converged"]].reset_index(),
                         rope, settings.decision["hdi_prob"], f"{family_key}: H1-H5 and gates (99% HDI, ROPE shaded)")
    depth_png = delta_by_depth_plot(result.by_depth)
    (directory / "forest.png").write_bytes(forest)
    (directory / "delta_by_depth.png").write_bytes(depth_png)
    shown = table[["contrast", "kind", "status", "mean", "hdi_low", "hdi_high", "label", "rhat", "ess_bulk",
                   "convergence_problems"]]
    return dg.Output(table, metadata={
        "estimands": dg.MetadataValue.md(shown.round(3).to_markdown(index=False)),
        "forest plot": dg.MetadataValue.md(markdown_image(forest, "forest plot of H1-H5 and the gates")),
        "Delta by depth": dg.MetadataValue.md(markdown_image(depth_png, "Delta by depth for the six cells")),
        "plots (PNG files)": dg.MetadataValue.path(str(directory)),
        "frame set": "pilot (descriptive)" if prefix else "confirmatory",
        "flags": "; ".join(flags) or "none", "model compilations": fitter.compilations,
        "exclusions by cell (4.8)": dg.MetadataValue.md(
            result.exclusions.to_markdown(index=False) if result.exclusions is not None else "none"),
        "draws": f"{draws_path} (sha256 {sha256_file(draws_path)[:12]})",
    })


@dg.asset_check(asset=posteriors, blocking=GATES_BLOCK, description=(
    "Convergence of every reported contrast (6.1): R-hat <= 1.01, bulk and tail ESS >= 400, "
    "no divergences. Blocks (confirmatory mode) only on the estimands that can change the "
    "reading: H1-H5, the gates and the controls; a secondary or sensitivity contrast that "
    "misses the rule is a warning and a flag on the reading."))
def posteriors_converged(posteriors: pd.DataFrame) -> dg.AssetCheckResult:
    estimated = posteriors[(posteriors["status"] == "estimated") & posteriors["rhat"].notna()]
    blocking, flagged = convergence_split(estimated)
    listed = lambda bad: " | ".join(f"{r.contrast}: {r.convergence_problems}" for r in bad.itertuples())
    parts = []
    if len(blocking):
        parts.append("not converged (H1-H5, gates, controls): " + listed(blocking) +
                     ". What to change: more tuning and draws (settings: sampler), or more frames where frame effects "
                     "are not identified (one pilot frame cannot separate them from the intercept); never read a label "
                     "that did not converge.")
    if len(flagged):
        parts.append("secondary/sensitivity not converged (flagged, cannot change the reading): " + listed(flagged))
    return dg.AssetCheckResult(
        passed=not parts, severity=dg.AssetCheckSeverity.ERROR if len(blocking) else dg.AssetCheckSeverity.WARN,
        description="every reported contrast converged" if not parts else " ".join(parts),
        metadata={"diagnostics": dg.MetadataValue.md(estimated[["contrast", "kind", "rhat", "ess_bulk", "ess_tail",
                                                                "divergences"]].round(3).to_markdown(index=False))})


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def section8_reading(context: dg.AssetExecutionContext, posteriors: pd.DataFrame,
                     registration_record: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Section 8 reading of one configuration (D5 Table 8): a pure function of the
    labels of H2, H5 and gates (a)-(c) and the flags (controls, binding, power), with the
    qualifiers the protocol requires and every flag the analysis carries (failed pilot gates,
    non-converged contrasts, pilot-only data, stand-ins). The cross-family statement is
    ``cross_family_statement``."""
    record = _record(registration_record)
    args = reading_inputs(posteriors, record)
    in_context = args.pop("in_context")
    reading = fear_assets.section8_reading(**args)
    not_converged, secondary_not_converged = convergence_split(posteriors)
    flags = [*reading.flags, *(f for f in str(posteriors["failed_gates"].iloc[0]).split("; ") if f)]
    if args["binding_failed"] and reading.row != 2:
        flags.append(f"in-context binding {in_context} below the registered rate: H2-H5 uninterpretable")
    if reading.not_scored_gates:
        flags.append("gate(s) not scored, cannot pass: " + ", ".join(f"({g})" for g in reading.not_scored_gates))
    if len(not_converged):
        flags.append("NOT CONVERGED: " + ", ".join(not_converged["contrast"]) + " (labels not to be read)")
    if len(secondary_not_converged):
        flags.append("secondary/sensitivity not converged (cannot change the reading): "
                     + ", ".join(secondary_not_converged["contrast"]))
    not_scored = posteriors[posteriors["status"].isin(["not_scored", "not_available"]) &
                            posteriors["kind"].isin(["confirmatory", "gate", "control"])]
    if len(not_scored):
        flags.append("not scored in this design: " + ", ".join(not_scored["contrast"]))
    row = {"family": context.partition_key, "code": reading.code, "row": reading.row,
           "qualifiers": "; ".join(reading.qualifiers), "descriptive_only": reading.descriptive_only,
           **{k: args[k] for k in ("h2", "h5", "gate_a", "gate_b", "gate_c")},
           "controls_failed": args["controls_failed"], "binding_failed": args["binding_failed"],
           "binding_in_context": in_context, "h2_meaningful": args["h2_meaningful"],
           "gates_underpowered": "not run" if args["gates_underpowered"] is None else str(args["gates_underpowered"]),
           "gates_not_scored": ",".join(reading.not_scored_gates), "flags": "; ".join(flags)}
    context.log.info(f"Section 8 reading for {context.partition_key}: {reading.code} (row {reading.row})")
    return dg.Output(pd.DataFrame([row]), metadata={
        "reading": f"{reading.code} (D5 row {reading.row})",
        "labels": f"H2 {args['h2']}, H5 {args['h5']}, gate a {args['gate_a']}, gate b {args['gate_b']}, gate c {args['gate_c']}",
        "qualifiers": "; ".join(reading.qualifiers) or "none", "flags": "; ".join(flags) or "none"})


@dg.asset(group_name=GROUP, kinds={"duckdb", "python"},
          ins={"section8_reading": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
def cross_family_statement(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                           section8_reading: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.2: a statement about current language models in general needs the same H2 label in
    all three registered families (the embedded demo family does not count); until each
    has a reading, none is made, and a family whose reading is row 1 or 2 of D5 (all results
    descriptive; H2-H5 uninterpretable) has no H2 label to enter it. A pooled estimate would
    be descriptive only."""
    settings = protocol.settings()
    registered = [k for k, f in settings.families.items() if f.role in ("primary", "replication")]
    result = cross_family_statement_of(section8_reading, registered)
    statement = result.statement
    table = pd.DataFrame([{"families": json.dumps(result.labels), "missing": ", ".join(result.missing),
                           "descriptive_only": json.dumps(result.descriptive), "statement": statement}])
    return dg.Output(table, metadata={"statement": statement})
