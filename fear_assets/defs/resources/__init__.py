"""Dagster resources, one file each: the registered protocol inputs and the DuckDB store."""

from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.defs.resources.store import duckdb_io_manager, store_io_manager

__all__ = ["ProtocolResource", "duckdb_io_manager", "store_io_manager"]
