"""The pilot's teacher-forced scores (protocol 4.5) and the positive-control documents
scored at the band depths (4.6, Appendix C step 2)."""

import dagster as dg
import pandas as pd

from fear_assets.lm.resumable import discard_chunks
from fear_assets.defs.assets.steps import not_applicable_output, score_table
from fear_assets.design.scored import control_rows, scored_rows
from fear_assets.defs.automation import MODEL_RETRY, model_step
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.defs.partitions import FAMILY_DEPTH_EXPR, family_depth_partitions, family_of_partition, partition_parts
from fear_assets.pilot.depth_rules import band_depth_keys
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="gpu", output_required=False,
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY,
          ins={"model_manifest": dg.AssetIn(partition_mapping=family_of_partition)})
@model_step
def pilot_scores(context: dg.AssetExecutionContext, protocol: ProtocolResource, language_model: LanguageModelResource,
                 pilot_trial_table: pd.DataFrame, model_manifest: pd.DataFrame):
    """Teacher-forced scores of the pilot trials of one family x depth (protocol 4.5): "one
    immutable row per trial" with the canonical reports' mean and summed log-probabilities
    in the document and in its distractor-only baseline, Delta (and its summed, first-person
    and recall versions), the forced-choice probabilities, the greedy answer with its
    truncation flag, attention mass to each sentence, and the residual-feature row
    (features in a checksummed .npy file). One prefill per document; documents over the
    context window are excluded with a reason (4.8)."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    if pilot_trial_table.empty:
        context.log.info(f"{depth}|{family_key}: no pilot trials stored for this partition: not scored")
        return
    table = scored_rows(settings, family_key, pilot_trial_table)
    result, metadata = score_table(context, protocol, language_model, table, family_key, depth, depth, model_manifest)
    yield dg.Output(result, metadata=metadata)
    discard_chunks(protocol.cache_dir, family_key, depth)  # the store holds the partition now


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="gpu", output_required=False,
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS, retry_policy=MODEL_RETRY,
          ins={"pilot_depths": dg.AssetIn(partition_mapping=family_of_partition),
               "model_manifest": dg.AssetIn(partition_mapping=family_of_partition)})
@model_step
def pilot_control_scores(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                         language_model: LanguageModelResource, pilot_trial_table: pd.DataFrame,
                         pilot_depths: pd.DataFrame, model_manifest: pd.DataFrame):
    """The pilot's positive-control documents (protocol 4.6, D4), scored after the depth band
    is fixed and only at the band depths (Appendix C step 2: "their contrasts are averaged
    over the band"). A depth outside the band materialises nothing."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    band = band_depth_keys(pilot_depths)
    if (skipped := not_applicable_output(context, settings, family_key, depth, band)) is not None:
        yield skipped
        return
    if pilot_trial_table.empty:
        context.log.info(f"{depth}|{family_key}: no pilot trials stored for this partition: not scored")
        return
    table = control_rows(settings, pilot_trial_table)  # with a baseline re-scored for them (design/scored.py)
    if table.empty:
        context.log.info(f"{depth}|{family_key}: no pilot control blocks in the trial table")
        return
    result, metadata = score_table(context, protocol, language_model, table, family_key, depth,
                                   f"{depth}_pilot_controls", model_manifest)
    yield dg.Output(result, metadata=metadata)
    discard_chunks(protocol.cache_dir, family_key, f"{depth}_pilot_controls")  # the store holds it now
