"""Binding (protocol 4.2) and generated-report scoring (4.5) of the pilot."""

import dagster as dg
import pandas as pd

from fear_assets.defs.assets.steps import answer, tested_builder
from fear_assets.defs.automation import MODEL_RETRY, model_step
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.defs.metadata import metadata_image
from fear_assets.core.numbers import number
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.lm.models import registry
from fear_assets.pilot.binding import binding, binding_gate_description, binding_gate_verdict
from fear_assets.pilot.report_scoring import score_pilot_reports, scorer_agreement_description
from fear_assets.report import plots as report_plots
from fear_assets.stimuli.name_gate import selected_names

BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY, ins={"pilot_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
@model_step
def binding_results(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                    language_model: LanguageModelResource, name_gate: pd.DataFrame, pilot_scores: pd.DataFrame,
                    assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Binding (4.2). Single-sentence checks: "each agent sentence alone after the system
    prompt, asked whether it refers to the model itself, the other assistant or the human
    manager", for every content, name and role (18 per frame); a frame failing any check is
    replaced like a matching failure. In-context checks: the 40 documents at the deepest
    depth built from the pilot frames (block pilot_binding_in_context); "a pass rate below
    90% makes the configuration's self contrasts (H2-H5) uninterpretable", which is carried
    to the Section 8 reading."""
    family_key = context.partition_key
    names = selected_names(name_gate)
    spec, builder = tested_builder(protocol, language_model, family_key, names)
    result = binding(builder, protocol.bank(), pilot_scores, assignment_key, names,
                     protocol.view(family_key),
                     lambda questions, letters: answer(language_model, spec, questions, letters))
    table, failing = result.table, result.failing
    return dg.Output(table, metadata=named_metadata(context, {
        "binding pass rates (plot)": metadata_image(report_plots.binding_plot(table, result.pass_rate_min),
                                                                 "binding pass rates"),
        "in-context pass rate": number(result.rate, "rate") if result.rate is not None else "not scored",
        "in-context": result.in_context_message,
        "frames failing a single-sentence check": int(len(failing)),
        "failing checks": md_table(failing[["item_id", "n_correct", "n_checks", "failed_checks"]]),
    }))


@dg.asset_check(asset=binding_results, blocking=True,
                description=GATE_DESCRIPTION + binding_gate_description(DEFINITION_SETTINGS))
def binding_gate(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, binding_results: pd.DataFrame) -> dg.AssetCheckResult:
    verdict = binding_gate_verdict(binding_results)
    return gate_result(
        context, binding_results, passed=verdict.passed,
        # Only the frame shortfall stops registration; the in-context rate is read (D5 row 2).
        severity=gate_severity(protocol, context, binding_results, stops=verdict.stops),
        description=verdict.description,
        metadata={"in-context": verdict.in_context, "frames failing single-sentence checks": verdict.failing_frames,
                  "next step": verdict.next_step})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY, ins={"pilot_scores": BY_DEPTH, "pilot_trial_table": BY_DEPTH})
@model_step
def report_scoring(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   language_model: LanguageModelResource, pilot_scores: pd.DataFrame,
                   pilot_trial_table: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Generated-report scoring of the pilot (4.5): whether each greedy answer mentions the
    agent item and the neutral item, "by the frozen keyword rule and, independently, by the
    blinded scorer model" registered for the family (it sees only the answer and the item's
    text); disagreements go to a third pass of the rule on word stems; refusals are their own
    category. Cohen's kappa between rule and scorer must reach the registered 0.80."""
    settings, family_key = protocol.settings(), context.partition_key
    spec = registry(settings, family_key)["scorer"]
    _, tokenizer = language_model.load(spec)
    result = score_pilot_reports(pilot_scores, pilot_trial_table, protocol.bank(), protocol.view(family_key),
                                 tokenizer, spec.checkpoint,
                                 lambda questions, letters: answer(language_model, spec, questions, letters),
                                 context.log.info)
    table, kappa = result.table, result.kappa
    by = table.groupby(["side", "category"]).size().unstack(fill_value=0) if result.answers else None
    return dg.Output(table, metadata=named_metadata(context, {
        "kappa": number(kappa, "kappa") if kappa is not None else "undefined",
        "verdict": result.message, "answers": result.answers,
        "categories by side": md_table(by, index=True) if by is not None else "none (no answer to score)",
        "disagreements resolved by the stem pass": int(table["stem"].notna().sum()),
    }))


@dg.asset_check(asset=report_scoring, blocking=True,
                description=GATE_DESCRIPTION + scorer_agreement_description(DEFINITION_SETTINGS))
def scorer_agreement(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, report_scoring: pd.DataFrame) -> dg.AssetCheckResult:
    first = report_scoring.iloc[0]
    return gate_result(context, report_scoring, passed=bool(first["gate_passed"]), description=str(first["message"]),
                       severity=gate_severity(protocol, context, report_scoring),
                       metadata={"kappa": number(first["kappa"], "kappa"),
                                 "refusals": int(report_scoring["refusal"].sum())})
