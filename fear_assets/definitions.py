"""The one entry point: a single Definitions object for the "Two Facts, One Gate" location."""

from __future__ import annotations

import warnings

import dagster as dg

# Partition mappings and data versions are Dagster beta APIs we rely on deliberately.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.assets import design, stimuli
from fear_assets.resources import ProtocolResource, duckdb_io_manager

all_assets = [stimuli.frame_bank, design.trial_table, design.assignment_key, design.trial_accounting]
all_checks = [stimuli.bank_freeze, design.accounting_closed]

#: Everything that exists so far for one family; the main job runs it per partition.
foundation_job = dg.define_asset_job(
    "foundation_job",
    selection=dg.AssetSelection.assets(design.trial_table, design.assignment_key),
    description="Trial table and assignment key of one family x depth partition.",
)


def resources(duckdb_path: str | None = None, **protocol_paths: str) -> dict:
    return {"io_manager": duckdb_io_manager(duckdb_path), "protocol": ProtocolResource(**protocol_paths)}


defs = dg.Definitions(assets=all_assets, asset_checks=all_checks, jobs=[foundation_job], resources=resources())
