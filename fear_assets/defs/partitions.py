"""What Dagster fixes when the definitions load: the partitions.

Each asset shows exactly the partitions the registered design (and the registered simulation)
will run: a family x depth asset has one partition per depth a family registers (the embedded
family's reduced design has two, a registered family eight), and ``power_simulation`` one per
simulation batch of each family's own simulation (``simulation.batches.batch_keys_of``). Both
are ``StaticPartitionsDefinition``\\ s of exactly those combinations (a multi-partition is a cross
product: a family would show depths it never runs and the power simulation every other
family's batches). Their keys read as the multi-partition keys did, "<depth>|<family>" and
"<batch>|<family>" (``partition_key``), so run tags, resume keys, ``fear`` commands and stored
rows are unchanged; the stores keep the ``depth`` and ``family`` columns and select a
partition by the key rebuilt from them (``FAMILY_DEPTH_EXPR``). Every reader of a key's
family, depth or batch goes through ``split_partition_key``.

Dagster needs the partition keys before any run, so the settings file
(``core.settings.settings_path()``, the same file the ``protocol`` resource reads by default) is
read once here for exactly these facts (``Layout.of``); every registered number a step uses
comes from the ``protocol`` resource at run time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import dagster as dg

warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.core.settings import ProtocolSettings, load_settings, settings_path
from fear_assets.defs.resources.store import KEY_SEPARATOR, joined_key_expr
from fear_assets.simulation.batches import batch_keys_of

FAMILY = "family"
DEPTH = "depth"
BATCH = "batch"


def partition_key(family_key: str, part: str) -> str:
    """The key of ``family_key``'s depth or batch ``part``: "<part>|<family>" (the order the
    multi-partition keys had, dimension names sorted)."""
    return f"{part}{KEY_SEPARATOR}{family_key}"


class PartitionParts(NamedTuple):
    """A partition key read: its family and, for a family x depth or family x batch key, the
    depth or batch (None for a per-family key)."""

    family: str
    part: str | None


def split_partition_key(key) -> PartitionParts:
    """THE parser of a partition key: "<family>", "<depth>|<family>" or "<batch>|<family>"
    (a ``dg.MultiPartitionKey`` of the same dimensions reads the same)."""
    text = str(key)
    part, sep, family = text.rpartition(KEY_SEPARATOR)
    if not sep:
        return PartitionParts(text, None)
    if not part or not family or KEY_SEPARATOR in part:
        raise ValueError(f"partition key {text!r} is not '<family>', '<depth>|<family>' or '<batch>|<family>'")
    return PartitionParts(family, part)


def family_of_key(key) -> str:
    """The family a partition key belongs to."""
    return split_partition_key(key).family


@dataclass(frozen=True)
class Layout:
    """The definition-time facts of the settings: the families, each family's registered
    depth keys and each family's own simulation batch keys (in the settings' order)."""

    families: tuple[str, ...]
    depths: tuple[tuple[str, tuple[str, ...]], ...]
    batches: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, settings: ProtocolSettings) -> "Layout":
        families = tuple(settings.families)
        return cls(families, tuple((f, tuple(settings.family(f).depth_keys)) for f in families),
                   tuple((f, tuple(batch_keys_of(settings, f))) for f in families))

    def depth_keys_of(self, family_key: str) -> tuple[str, ...]:
        return dict(self.depths)[family_key]

    def batch_keys_of(self, family_key: str) -> tuple[str, ...]:
        return dict(self.batches)[family_key]

    def family_depth_keys(self, family_key: str) -> list[str]:
        return [partition_key(family_key, d) for d in self.depth_keys_of(family_key)]

    def family_batch_keys(self, family_key: str) -> list[str]:
        return [partition_key(family_key, b) for b in self.batch_keys_of(family_key)]


@dataclass(frozen=True)
class Partitions:
    """The partitions definitions and the per-family mappings between them, built from a layout."""

    family: dg.StaticPartitionsDefinition
    family_depth: dg.StaticPartitionsDefinition
    family_batch: dg.StaticPartitionsDefinition
    #: Per-family input of a family x depth asset: all of that family's depths (and only them).
    all_depths_of_family: dg.StaticPartitionMapping
    #: Family x depth input of a per-family asset: the partition's family.
    family_of_partition: dg.StaticPartitionMapping
    #: Family x batch input of a per-family asset: the batch's family.
    family_of_batch: dg.StaticPartitionMapping
    #: Per-family input of a family x batch asset (``power_summary`` on ``power_simulation``):
    #: all of that family's own batches.
    all_batches_of_family: dg.StaticPartitionMapping


def build_partitions(layout: Layout) -> Partitions:
    depth_keys = {f: layout.family_depth_keys(f) for f in layout.families}
    batch_keys = {f: layout.family_batch_keys(f) for f in layout.families}
    to_family = {k: f for f, keys in depth_keys.items() for k in keys}
    batch_to_family = {k: f for f, keys in batch_keys.items() for k in keys}
    return Partitions(
        family=dg.StaticPartitionsDefinition(list(layout.families)),
        family_depth=dg.StaticPartitionsDefinition([k for f in layout.families for k in depth_keys[f]]),
        family_batch=dg.StaticPartitionsDefinition([k for f in layout.families for k in batch_keys[f]]),
        # StaticPartitionMapping maps an upstream key to the downstream keys it feeds
        all_depths_of_family=dg.StaticPartitionMapping(to_family),
        family_of_partition=dg.StaticPartitionMapping(depth_keys),
        family_of_batch=dg.StaticPartitionMapping(batch_keys),
        all_batches_of_family=dg.StaticPartitionMapping(batch_to_family),
    )


#: The settings the definitions are built from (check descriptions quote their registered numbers).
DEFINITION_SETTINGS = load_settings(settings_path())
LAYOUT = Layout.of(DEFINITION_SETTINGS)
PARTITIONS = build_partitions(LAYOUT)
family_partitions = PARTITIONS.family
#: family x depth, only the depths each family registers ("<depth>|<family>").
family_depth_partitions = PARTITIONS.family_depth
#: family x simulation batch (``power_simulation``, 6.3), only each family's own batches ("<batch>|<family>").
power_partitions = PARTITIONS.family_batch
all_depths_of_family = PARTITIONS.all_depths_of_family
family_of_partition = PARTITIONS.family_of_partition
family_of_batch = PARTITIONS.family_of_batch
all_batches_of_family = PARTITIONS.all_batches_of_family
#: The stored columns a family x depth key is rebuilt from: the IO manager replaces exactly the
#: rows whose ``depth || '|' || family`` is the partition's key (the Parquet store splits the
#: key back into ``depth=<d>/family=<f>/``).
FAMILY_DEPTH_EXPR = {"partition_expr": joined_key_expr((DEPTH, FAMILY))}
FAMILY_EXPR = {"partition_expr": FAMILY}


def partitioning_of_definition(partitions_def) -> str:
    """Which partitioning an asset has: unpartitioned, by_family, by_depth (family x depth) or
    by_batch (family x simulation batch)."""
    if partitions_def is None:
        return "unpartitioned"
    if partitions_def == family_depth_partitions:
        return "by_depth"
    if partitions_def == power_partitions:
        return "by_batch"
    return "by_family"


def _family_and_part(context, what: str) -> tuple[str, str]:
    parts = split_partition_key(context.partition_key)
    if parts.part is None:
        raise ValueError(f"partition {context.partition_key!r} is a family's, not a family x {what} partition")
    return parts.family, parts.part


def partition_parts(context) -> tuple[str, str]:
    """(family, depth) of a family x depth step's partition."""
    return _family_and_part(context, DEPTH)


def batch_parts(context) -> tuple[str, str]:
    """(family, batch) of a family x batch step's partition."""
    return _family_and_part(context, BATCH)


def registered_partition_keys(settings: ProtocolSettings, family_key: str) -> list[str]:
    """The family x depth keys a family's registered design materialises."""
    return [partition_key(family_key, d) for d in settings.family(family_key).depth_keys]


def power_partition_keys(settings: ProtocolSettings, family_key: str) -> list[str]:
    """The family x batch keys of a family's simulation batches."""
    return [partition_key(family_key, k) for k in batch_keys_of(settings, family_key)]
