"""Partitions built from the registered settings: family x depth, and family alone.

Depth keys are indices (d1..dN, D1); a family whose registered design has fewer depths
(the embedded family's reduced design) does not materialise the indices it lacks.
Multi-partition keys read "<depth>|<family>" (dimension names sorted).
"""

from __future__ import annotations

import warnings

import dagster as dg

warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.settings import ProtocolSettings, load_settings

FAMILY = "family"
DEPTH = "depth"


def build_partitions(settings: ProtocolSettings) -> tuple[dg.MultiPartitionsDefinition, dg.StaticPartitionsDefinition]:
    families = list(settings.families)
    max_depths = max(len(f.depth_tokens) for f in settings.families.values())
    family_depth = dg.MultiPartitionsDefinition({
        FAMILY: dg.StaticPartitionsDefinition(families),
        DEPTH: dg.StaticPartitionsDefinition([f"d{i}" for i in range(1, max_depths + 1)]),
    })
    return family_depth, dg.StaticPartitionsDefinition(families)


SETTINGS = load_settings()
family_depth_partitions, family_partitions = build_partitions(SETTINGS)
#: DuckDB columns that hold each partition dimension (the IO manager replaces exactly these rows).
FAMILY_DEPTH_EXPR = {"partition_expr": {FAMILY: "family", DEPTH: "depth"}}
FAMILY_EXPR = {"partition_expr": "family"}
#: Per-family input of a family x depth asset: all of that family's depths.
all_depths_of_family = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=FAMILY)
#: Family x depth input of a per-family asset: the partition's family.
family_of_partition = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=FAMILY)


def partition_parts(context) -> tuple[str, str]:
    keys = context.partition_key.keys_by_dimension
    return keys[FAMILY], keys[DEPTH]


def registered_partition_keys(settings: ProtocolSettings, family_key: str) -> list[str]:
    """The multi-partition keys a family's registered design materialises."""
    return [dg.MultiPartitionKey({FAMILY: family_key, DEPTH: d}) for d in settings.family(family_key).depth_keys]
