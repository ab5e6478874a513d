"""The depth band and H5 depth (protocol 5) and the positive controls (4.6, D4) of the pilot."""

import math

import dagster as dg
import pandas as pd

from fear_assets.analysis.pilot_controls import controls_description, controls_verdict
from fear_assets.analysis.pilot_controls import pilot_controls as pilot_controls_step
from fear_assets.core.settings import DepthBand, depth_key
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.pilot.depth_rules import pilot_depth_band

BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"},
          ins={"pilot_scores": BY_DEPTH})
def pilot_depths(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                 pilot_scores: pd.DataFrame, report_scoring: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Depth band (H1-H4) and H5 depth, named as depth indices (protocol 5), "from pilot
    frames only and pooled over all six cells" (no agent-by-content contrast is read): the
    band is the depths at which the generated report mentions the neutral partner on 20-80%
    of trials (else the two closest to 50%); the H5 depth is the deepest depth with pooled
    forced-choice accuracy in 0.60-0.90 (else the one closest to 0.75). A mention is the
    resolved outcome of 4.5 (``report_scoring``); refusals do not enter the rate."""
    result = pilot_depth_band(pilot_scores, report_scoring, protocol.view(context.partition_key))
    table = result.table
    return dg.Output(table, metadata=named_metadata(context, {
        "depth band": ", ".join(DepthBand.of(result.band).keys), "band rule": result.band_rule,
        "H5 depth": depth_key(result.h5_index), "H5 rule": result.h5_rule,
        "by depth": md_table(table[["depth", "depth_tokens", "trials", "answers", "refusals", "mentions",
                                    "neutral_mention_rate", "fc_accuracy", "in_band", "is_h5_depth"]],
                             {"neutral_mention_rate": "rate", "fc_accuracy": "rate"}),
    }))


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "pymc"},
          ins={"pilot_scores": BY_DEPTH, "pilot_control_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
def pilot_controls(context: dg.AssetExecutionContext, protocol: ProtocolResource, pilot_scores: pd.DataFrame,
                   pilot_control_scores: pd.DataFrame, assignment_key: pd.DataFrame,
                   sentence_surprisal: pd.DataFrame, judge_sentence_surprisal: pd.DataFrame,
                   pilot_depths: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The four positive controls on the pilot frames (4.6, D4), "each contrast signed so the
    predicted direction is positive and averaged over the depth band": the primary model is
    fitted once on the control cells together with the matched primary cells, with a
    condition factor and its interactions and shared frame effects (the addressee control,
    whose contrast lies within its own cells, is fitted on them). A control passes with
    posterior mean >= 0.15 and its 99% HDI wholly above zero; a failing control may be
    strengthened once before registration. Also records gate (c)'s scale (6.2): the
    trial-level residual SD implied by the primary model fitted to the pilot over all pilot
    depths, for the tested model and, where scored, the judge (with its own surprisals)."""
    step = pilot_controls_step(pilot_scores, pilot_control_scores, pilot_depths, assignment_key, sentence_surprisal,
                               judge_sentence_surprisal, protocol.bank(),
                               protocol.view(context.partition_key), context.log.info)
    result = step.table
    return dg.Output(result, metadata=named_metadata(context, {
        "controls": md_table(result[["control", "mean", "hdi_low", "hdi_high", "passed", "reason"]]),
        "pilot sigma (gate (c) scale; SD implied by the Student-t fit, all pilot depths)":
            round(step.sigma, 4) if math.isfinite(step.sigma) else "not finite (nu <= 2): the gate_c_scale gate fails",
        # How many model shapes this step compiled (others reused from an earlier step of the
        # process): run metadata, not part of the stored table, which is the same either way.
        "model compilations": step.compilations,
    }))


@dg.asset_check(asset=pilot_controls, blocking=True,
                description=GATE_DESCRIPTION + controls_description(DEFINITION_SETTINGS))
def positive_controls_pass(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, pilot_controls: pd.DataFrame) -> dg.AssetCheckResult:
    verdict = controls_verdict(pilot_controls)
    return gate_result(
        context, pilot_controls, passed=verdict.passed, description=verdict.description,
        severity=gate_severity(protocol, context, pilot_controls),
        metadata={"controls": md_table(pilot_controls[["control", "mean", "hdi_low", "hdi_high", "passed"]]),
                  "what it means": verdict.what_it_means})
