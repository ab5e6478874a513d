"""The pilot's trial table and the masking key (protocol 4.4, D2, D6)."""

import dagster as dg
import pandas as pd

from fear_assets.defs.assets.steps import trial_table_output
from fear_assets.design.masking import assignment_key as make_key
from fear_assets.defs.partitions import FAMILY_DEPTH_EXPR, family_depth_partitions, family_of_partition, partition_parts
from fear_assets.defs.modes import named_metadata
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="duckdb", output_required=False,
          kinds={"duckdb", "python"}, ins={"name_gate": dg.AssetIn(partition_mapping=family_of_partition)})
def pilot_trial_table(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                      language_model: LanguageModelResource, frame_bank: pd.DataFrame, name_gate: pd.DataFrame):
    """The masked trial table of the pilot blocks of one family x depth (protocol 4.4, D2):
    "one row per trial of every registered block, naming its block, frame, fear, unit,
    rotation, pair order, depth, content option and masked condition code", here for the
    blocks built from the pilot frames (Appendix C step 2: the pilot runs before
    registration). Documents are rendered through the reader's chat template; the
    distractor is cut to exactly the depth's token count and shared by the six cells of a
    unit. The confirmatory blocks are ``confirmatory_trial_table`` (stage collection)."""
    family_key, depth = partition_parts(context)
    yield trial_table_output(context, protocol, frame_bank, name_gate, family_key, depth, True, {}, language_model)


@dg.asset(partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="duckdb", output_required=False,
          kinds={"duckdb", "python"}, deps=["frame_bank"])
def assignment_key(context: dg.AssetExecutionContext, protocol: ProtocolResource):
    """D6 masking key of one family x depth: "condition code -> condition, agent, content and
    cell index, a seeded permutation per configuration", stored apart from the trial tables;
    only the unmasking step reads it (the pilot's rows for the pilot gates, the
    confirmatory rows once scoring is locked)."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    key = make_key(settings, family_key).assign(depth=depth)
    yield dg.Output(key, metadata=named_metadata(context, {"codes": len(key)}))
