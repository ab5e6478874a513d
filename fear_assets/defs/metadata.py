"""Dagster metadata values built from the stage packages' pure outputs."""

from __future__ import annotations

import dagster as dg

from fear_assets.defs.partitions import family_of_key
from fear_assets.report.plots import markdown_image


def metadata_image(png: bytes, alt: str) -> dg.MetadataValue:
    """The Dagster metadata value that shows ``png`` in the UI (Markdown with a data URI)."""
    return dg.MetadataValue.md(markdown_image(png, alt))


def partition_metadata(context) -> dict[str, str]:
    """The family and partition an asset or check ran for, as metadata entries: with several
    families a failed gate's page must say whose gate it is."""
    if context is None or not context.has_partition_key:
        return {}
    key = context.partition_key
    return {"family": family_of_key(key), "partition": str(key)}
