"""Surprisal matching and zero preference under the tested checkpoint (protocol 4.3)."""

import dagster as dg
import pandas as pd

from fear_assets.defs.assets.steps import answer, tested_builder
from fear_assets.core.numbers import number
from fear_assets.defs.automation import MODEL_RETRY, model_step
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.defs.metadata import metadata_image
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, family_partitions
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.pilot.matching import match_frames, matching_gate_description, matching_gate_verdict, read_tost
from fear_assets.pilot.zero_preference import zero_preference as zero_preference_step
from fear_assets.pilot.zero_preference import zero_preference_description, zero_preference_failures
from fear_assets.report import plots as report_plots
from fear_assets.stimuli.name_gate import selected_names

#: The TOST table's p-values read as p-values (the rest as estimates).
TOST_QUANTITIES = {"tost_p": "p", "p_lower": "p", "p_upper": "p"}


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"})
def matched_frames(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   sentence_surprisal: pd.DataFrame, base_sentence_surprisal: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Surprisal matching (protocol 4.3) under this family's tested checkpoint: per frame the
    largest threat/harmless and agent-pair difference in mean non-name surprisal over the
    three rotations and both options ("retained within 0.10 nats/token"), the replacement
    of a failing confirmatory frame by its registered rewrite, else the lowest-numbered
    passing reserve of its fear, the drop rate by fear, and two one-sided tests that the
    retained bank's mean differences lie within +-0.05 (here on this stage's selection; the
    registration record re-runs the TOST and the event matching on the final selection, after
    binding replacement, from the per-frame columns stored here). ``passes_base`` marks frames that
    also pass under the base checkpoint (the base-against-assistant comparison uses only those)."""
    result = match_frames(sentence_surprisal, base_sentence_surprisal, protocol.bank(),
                          protocol.view(context.partition_key))
    table = result.table
    return dg.Output(table, metadata=named_metadata(context, {
        "matching differences per frame (plot)": metadata_image(
            report_plots.matching_plot(table, result.tolerance),
            "matching differences per frame against the tolerance"),
        "retained confirmatory frames": int(table["selected"].sum()),
        "frames passing under tested and base (base-vs-assistant comparison)":
            ", ".join(result.passing_both) if result.passing_both is not None else "no base checkpoint",
        "frames to write": ", ".join(f"{fear} {n}" for fear, n in result.shortfall.items()) or "none",
        "drop rate by fear": md_table(result.drop_rate.to_frame("drop rate"), {"drop rate": "rate"}, index=True),
        "TOST (+-bound) across the retained bank": md_table(result.tost, TOST_QUANTITIES,
                                                            empty="no frame retained: not testable"),
        "events matched to the agent frames (4.3)": md_table(result.events, empty="no events in this design"),
    }))


@dg.asset_check(asset=matched_frames, blocking=True,
                description=GATE_DESCRIPTION + matching_gate_description(DEFINITION_SETTINGS))
def matching_gate(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, matched_frames: pd.DataFrame) -> dg.AssetCheckResult:
    problems, short = matching_gate_verdict(matched_frames, protocol.settings())
    return gate_result(
        context, matched_frames, passed=not problems,
        # 4.3: the bank-level tests bind on the final bank (the record's gate); here they warn.
        severity=gate_severity(protocol, context, matched_frames, stops=short),
        description="matching passes" if not problems else
        "; ".join(problems) + ". New frames go through the same matching before registration (4.3).",
        metadata={"TOST": md_table(read_tost(matched_frames), TOST_QUANTITIES, empty="no frame retained: not testable"),
                  "what it means": "the agent sentences differ in surprisal beyond the registered tolerance, so a "
                                   "Delta difference could be a surprisal difference" if problems else "none",
                  "next step": "write the listed frames (or rewrite the listed events), then re-run "
                               "sentence_surprisal and matched_frames" if problems else "none"},
    )


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY)
@model_step
def zero_preference(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                    language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Zero preference (4.3): with no document, every forced-choice question (each agent
    question of every frame, rotation, agent and content, and each partner question) under
    the tested checkpoint. The option probability of content option 1 is averaged over the
    two listing orders, so a preference for a letter or position (which the counterbalanced
    listing and H5's criterion absorb) is not read as a preference for a content; it must
    lie within the registered band. Failing items are listed for rewriting."""
    family_key = context.partition_key
    spec, builder = tested_builder(protocol, language_model, family_key, selected_names(name_gate))
    result = zero_preference_step(builder, protocol.bank(), protocol.view(family_key),
                                  lambda questions, letters: answer(language_model, spec, questions, letters),
                                  context.log.info)
    table, failures = result.table, result.failures
    return dg.Output(table, metadata=named_metadata(context, {
        "questions": len(result.per_listing), "items": int(table["item_id"].nunique()),
        "items failing": int(len(failures)), "verdict": result.message,
        "failing items": md_table(failures),
        "mean P(first-listed letter) (position bias, not a gate)": number(result.per_listing["p_first"].mean(),
                                                                         "probability"),
    }))


@dg.asset_check(asset=zero_preference, blocking=True,
                description=GATE_DESCRIPTION + zero_preference_description(DEFINITION_SETTINGS))
def zero_preference_gate(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, zero_preference: pd.DataFrame) -> dg.AssetCheckResult:
    failures = zero_preference_failures(zero_preference)
    passed = bool(zero_preference["gate_passed"].iloc[0])
    return gate_result(
        context, zero_preference, passed=passed, description=str(zero_preference["message"].iloc[0]),
        severity=gate_severity(protocol, context, zero_preference),
        metadata={"failing items": md_table(failures),
                  "questions": len(zero_preference),
                  "next step": "none" if passed else "rewrite the failing items' options (4.3) and re-run zero_preference"})
