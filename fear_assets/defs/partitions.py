"""What Dagster fixes when the definitions load: the partitions.

Depth keys are indices (d1..dN, D1; ``settings.depth_key``); a family whose registered
design has fewer depths (the embedded family's reduced design) does not materialise the
indices it lacks. Multi-partition keys read "<depth>|<family>" (dimension names sorted).

Dagster needs the partition keys before any run, so the
settings file (``core.settings.settings_path()``, the same file the ``protocol`` resource reads
by default) is read once here for exactly these facts (``core.settings.definition_layout``);
every registered number a step uses comes from the ``protocol`` resource at run time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import dagster as dg

warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.core.settings import ProtocolSettings, definition_layout, depth_key, load_settings, settings_path
from fear_assets.simulation.batches import all_batch_keys, batch_keys_of

FAMILY = "family"
DEPTH = "depth"
BATCH = "batch"


@dataclass(frozen=True)
class Layout:
    """The definition-time facts of the settings (core's, with the simulation's batch keys)."""

    families: tuple[str, ...]
    max_depths: int
    batch_keys: tuple[str, ...]

    @property
    def depth_keys(self) -> tuple[str, ...]:
        return tuple(depth_key(i) for i in range(1, self.max_depths + 1))

    @classmethod
    def of(cls, settings: ProtocolSettings) -> "Layout":
        core = definition_layout(settings)
        return cls(core.families, core.max_depths, tuple(all_batch_keys(settings)))


def build_partitions(layout: Layout) -> tuple[dg.MultiPartitionsDefinition, dg.StaticPartitionsDefinition]:
    family_depth = dg.MultiPartitionsDefinition({
        FAMILY: dg.StaticPartitionsDefinition(list(layout.families)),
        DEPTH: dg.StaticPartitionsDefinition(list(layout.depth_keys)),
    })
    return family_depth, dg.StaticPartitionsDefinition(list(layout.families))


#: The settings the definitions are built from (check descriptions quote their registered numbers).
DEFINITION_SETTINGS = load_settings(settings_path())
LAYOUT = Layout.of(DEFINITION_SETTINGS)
family_depth_partitions, family_partitions = build_partitions(LAYOUT)
#: family x simulation batch (``power_simulation``, 6.3).
power_partitions = dg.MultiPartitionsDefinition({
    FAMILY: dg.StaticPartitionsDefinition(list(LAYOUT.families)),
    BATCH: dg.StaticPartitionsDefinition(list(LAYOUT.batch_keys)),
})
#: DuckDB columns that hold each partition dimension (the IO manager replaces exactly these rows).
FAMILY_DEPTH_EXPR = {"partition_expr": {FAMILY: "family", DEPTH: "depth"}}
FAMILY_EXPR = {"partition_expr": "family"}
#: Per-family input of a family x depth asset: all of that family's depths.
all_depths_of_family = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=FAMILY)
#: Family x depth input of a per-family asset: the partition's family.
family_of_partition = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=FAMILY)
#: Family x batch input of a per-family asset.
family_of_batch = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=FAMILY)


def partition_parts(context) -> tuple[str, str]:
    keys = context.partition_key.keys_by_dimension
    return keys[FAMILY], keys[DEPTH]


def registered_partition_keys(settings: ProtocolSettings, family_key: str) -> list[str]:
    """The multi-partition keys a family's registered design materialises."""
    return [dg.MultiPartitionKey({FAMILY: family_key, DEPTH: d}) for d in settings.family(family_key).depth_keys]


def power_partition_keys(settings: ProtocolSettings, family_key: str) -> list:
    """The multi-partition keys of a family's simulation batches."""
    return [dg.MultiPartitionKey({FAMILY: family_key, BATCH: k}) for k in batch_keys_of(settings, family_key)]
