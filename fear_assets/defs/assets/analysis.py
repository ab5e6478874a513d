"""Stage "analysis" (protocol 6.1-6.2; D3-D4): H4 on probe log-odds and every registered
estimand, fitted on masked data and unmasked only once scoring is locked (D6).

Wiring only: each step is one function of ``fear_assets.analysis.steps``."""

import dagster as dg
import pandas as pd

from fear_assets.analysis import steps as analysis_steps
from fear_assets.analysis.estimands import estimand_view, h4_view
from fear_assets.analysis.plots import markdown_image
from fear_assets.core.hashing import sha256_file
from fear_assets.core.numbers import markdown_table, number
from fear_assets.defs.metadata import partition_metadata
from fear_assets.defs.modes import GATE_DESCRIPTION, check_family, gate_severity
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.registration.freeze import read_record
from fear_assets.defs.resources.protocol import ProtocolResource

#: 6.1's rule in the checks' descriptions, from the registered settings file.
CONVERGENCE_RULE = analysis_steps.convergence_description(DEFINITION_SETTINGS)
BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


def _text_md(table: pd.DataFrame) -> dg.MetadataValue:
    """A table whose cells are already written for a reader (the estimands view) as Markdown,
    kept as written (no number re-parsing)."""
    return dg.MetadataValue.md(table.to_markdown(index=False, disable_numparse=True))


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
    family_key = context.partition_key
    view = protocol.view(family_key)
    h4 = analysis_steps.h4_posterior(
        view, protocol.bank(), probe_outputs, probe_controls, pilot_probe_outputs, pilot_probe_controls,
        registration_record, sentence_surprisal, confirmatory_scores, pilot_scores, assignment_key,
        read_record(protocol.registration_dir), protocol.output_path("posteriors", family_key))
    context.log.info(f"{family_key}: H4 {h4.frame_set}: mean {number(h4.mean)}, 99% HDI "
                     f"[{number(h4.hdi_low)}, {number(h4.hdi_high)}] -> {h4.label}")
    return dg.Output(h4.table, metadata={
        **partition_metadata(context), "H4": _text_md(h4_view(h4.table)),
    })


@dg.asset_check(asset=h4_posterior, blocking=False, description=(
    f"Convergence of the H4 fit (6.1): {CONVERGENCE_RULE} for the reported contrast's parameters "
    "(registered under 'convergence'). A warning in either "
    "mode, never blocking: H4 does not change the reading (6.2), so a non-converged H4 is a "
    "flag on its own row (its label not to be read), never a stop on H2, H5 or the reading."))
def h4_converged(context: dg.AssetCheckExecutionContext, h4_posterior: pd.DataFrame) -> dg.AssetCheckResult:
    bad = analysis_steps.h4_not_converged(h4_posterior)
    family = check_family(context, h4_posterior) or "unknown family"
    return dg.AssetCheckResult(
        passed=bad.empty, severity=dg.AssetCheckSeverity.WARN,
        description=f"{family}: H4 " + ("converged" if bad.empty else
        "not converged: " + " | ".join(f"{r.frame_set}: {r.flags}" for r in bad.itertuples()) +
        ". What to change: more tuning and draws, more frames (one frame cannot separate frame effects from the "
        "intercept), or, where the outcome is constant (probe at the clip), nothing: H4 is estimation-only."),
        metadata={**partition_metadata(context), "family": family,
                  "diagnostics": _text_md(h4_view(h4_posterior))},
    )


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
    family_key = context.partition_key
    view = protocol.view(family_key)
    out = analysis_steps.posteriors(
        view, protocol.bank(), confirmatory_scores, pilot_scores, assignment_key, sentence_surprisal,
        judge_sentence_surprisal, registration_record, pilot_controls, h4_posterior, base_sentence_surprisal,
        report_scoring, read_record(protocol.registration_dir), protocol.output_path("posteriors", family_key),
        protocol.output_path("topic_counts.csv"), log=context.log.info)
    table, result = out.table, out.result
    return dg.Output(table, metadata={
        **partition_metadata(context),
        "estimands": _text_md(estimand_view(table)),
        "forest plot": dg.MetadataValue.md(markdown_image(out.forest_png, "forest plot of H1-H5 and the gates")),
        "Delta by depth": dg.MetadataValue.md(markdown_image(out.depth_png, "Delta by depth for the six cells")),
        "plots (PNG files)": dg.MetadataValue.path(out.directory),
        "frame set": "pilot (descriptive; reuses the reduced design's pilot scores)" if out.pilot_only
        else "confirmatory",
        "flags": "; ".join(out.flags) or "none", "model compilations": out.compilations,
        "exclusions by cell (4.8)": dg.MetadataValue.md(
            markdown_table(result.exclusions, {"rate": "rate"}) if result.exclusions is not None else "none"),
        "draws": f"{out.draws_path} (sha256 {sha256_file(out.draws_path)[:12]})",
        "fits (InferenceData, netCDF)": _text_md(out.fits_table),
        "frame effects sampled (registered rule, per fit)": dg.MetadataValue.md(markdown_table(pd.DataFrame(
            [{"fit": k, "frame effects": v} for k, v in analysis_steps.fits_frames(result).items()],
            columns=["fit", "frame effects"]))),
        "convergence remedy runs": dg.MetadataValue.md(markdown_table(pd.DataFrame(result.extensions))
                                                       if result.extensions else "none"),
    })


@dg.asset_check(asset=posteriors, blocking=True, description=GATE_DESCRIPTION + (
    f"Convergence of every reported contrast (6.1): {CONVERGENCE_RULE}. Blocks (confirmatory mode) only on "
    "the estimands that can stop the reading: H1-H3, H5, the gates and the controls; H4 (6.2: it never changes the reading) "
    "and a secondary or sensitivity contrast that misses the rule are a warning and a flag."))
def posteriors_converged(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, posteriors: pd.DataFrame) -> dg.AssetCheckResult:
    verdict = analysis_steps.convergence_verdict(posteriors)
    family = check_family(context, posteriors) or "unknown family"
    shown = estimand_view(verdict.estimated)[["contrast", "kind", "label as read", "converged", "R-hat", "bulk ESS",
                                              "tail ESS", "divergences"]]
    return dg.AssetCheckResult(
        passed=verdict.passed, severity=gate_severity(protocol, context, posteriors, stops=verdict.blocking),
        description=f"{family}: {verdict.description}",
        metadata={**partition_metadata(context), "family": family,
                  "diagnostics": _text_md(shown)})
