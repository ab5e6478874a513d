"""Dagster metadata values built from the stage packages' pure outputs."""

from __future__ import annotations

import dagster as dg

from fear_assets.report.plots import markdown_image


def metadata_image(png: bytes, alt: str) -> dg.MetadataValue:
    """The Dagster metadata value that shows ``png`` in the UI (Markdown with a data URI)."""
    return dg.MetadataValue.md(markdown_image(png, alt))
