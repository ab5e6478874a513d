"""Stage "collection" (protocol 4.4, 4.5, 4.7, D2; Appendix C step 5): the confirmatory
trial table built from the registration record, its scores and the closed accounting."""

import json

import dagster as dg
import pandas as pd

from fear_assets.lm.resumable import discard_chunks
from fear_assets.defs.assets.steps import score_table, trial_table_output
from fear_assets.defs.automation import MODEL_RETRY, model_step
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.design.accounting import accounting_verdict, close_accounting
from fear_assets.design.scored import scored_rows
from fear_assets.defs.partitions import (FAMILY_DEPTH_EXPR, FAMILY_EXPR, all_depths_of_family, family_depth_partitions,
                                    family_of_partition, family_partitions, partition_parts)
from fear_assets.defs.modes import gate_result, md_table, named_metadata
from fear_assets.registration.record import replacements_of
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource

OF_FAMILY = dg.AssetIn(partition_mapping=family_of_partition)
BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


def _record(registration_record: pd.DataFrame) -> dict:
    return json.loads(registration_record["record_json"].iloc[0])


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="duckdb", output_required=False,
          kinds={"duckdb", "python"}, ins={"name_gate": OF_FAMILY, "registration_record": OF_FAMILY})
def confirmatory_trial_table(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                             language_model: LanguageModelResource, frame_bank: pd.DataFrame,
                             name_gate: pd.DataFrame, registration_record: pd.DataFrame):
    """The masked trial table of the confirmatory blocks of one family x depth (protocol 4.4,
    D2), built after registration (Appendix C step 5) from the registered record: the frames
    a registered record replaced (4.3: "a failing confirmatory frame is replaced by its
    registered rewrite, else by the lowest-numbered passing reserve") are swapped in; a
    draft record changes nothing. The record is an input, so a re-registration marks this
    table and everything downstream stale."""
    family_key, depth = partition_parts(context)
    yield trial_table_output(context, protocol, frame_bank, name_gate, family_key, depth, False,
                             replacements_of(_record(registration_record)), language_model)


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="gpu", output_required=False,
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY, ins={"model_manifest": OF_FAMILY})
@model_step
def confirmatory_scores(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                        language_model: LanguageModelResource, confirmatory_trial_table: pd.DataFrame,
                        model_manifest: pd.DataFrame):
    """Teacher-forced scores of the confirmatory trials of one family x depth (protocol 4.5),
    the same readouts as ``pilot_scores``. A reduced design that scores no confirmatory
    block (the embedded demo) stores an empty table: the analysis then reuses the pilot's
    scores and says so."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    table = scored_rows(settings, family_key, confirmatory_trial_table)
    if table.empty:
        yield dg.Output(pd.DataFrame({"family": pd.Series(dtype=str), "depth": pd.Series(dtype=str)}),
                        metadata=named_metadata(context, {
                            "trials scored": 0, "note": "the design scores no confirmatory block here (reduced "
                                                        "design): the analysis reuses the pilot's scores"}))
        return
    result, metadata = score_table(context, protocol, language_model, table, family_key, depth,
                                   f"{depth}_confirmatory", model_manifest)
    yield dg.Output(result, metadata=metadata)
    discard_chunks(protocol.cache_dir, family_key, f"{depth}_confirmatory")  # the store holds it now


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"},
          ins={"pilot_trial_table": BY_DEPTH, "confirmatory_trial_table": BY_DEPTH})
def trial_accounting(context: dg.AssetExecutionContext, protocol: ProtocolResource, pilot_trial_table: pd.DataFrame,
                     confirmatory_trial_table: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The closed trial accounting of one family (protocol 4.7, D2): "per block, the
    registered count formula, the expected and actual rows and the per-cell (condition
    code) counts; a TOTAL row reconciles the blocks with the whole table", over the pilot
    and the confirmatory trial tables together."""
    result = close_accounting(pilot_trial_table, confirmatory_trial_table, protocol.bank(),
                              protocol.view(context.partition_key))
    table, trials = result.table, result.trials
    shown = table[table["status"] != "not applicable"]
    return dg.Output(table, metadata=named_metadata(context, {
        "trials": len(trials), "pilot trials": len(pilot_trial_table),
        "confirmatory trials": len(confirmatory_trial_table),
        "depths present": ", ".join(sorted(set(trials["depth"]))) if len(trials) else "none",
        "blocks off formula": int((table["status"] == "MISMATCH").sum()),
        "accounting": md_table(shown[["block", "formula", "expected_rows", "actual_rows", "codes_off", "status"]]),
    }))


@dg.asset_check(asset=trial_accounting, blocking=True, description=(
    "D2 closed accounting: every block's rows and every cell's rows equal the registered "
    "formula at the depths materialised, and the blocks sum to the trial tables."))
def accounting_closed(context: dg.AssetCheckExecutionContext, trial_accounting: pd.DataFrame) -> dg.AssetCheckResult:
    passed, description, bad = accounting_verdict(trial_accounting)
    return gate_result(context, trial_accounting, passed=passed, description=description,
                       metadata={"mismatches": md_table(bad)})
