"""Batch results of the power simulation: one Parquet file per batch (protocol 6.3, D7).

Parallel steps (processes or pods) each write their own file, atomically (a temporary file
in the same directory, then ``os.replace``), so no two writers ever contend for one DuckDB
file; DuckDB reads them all with one glob. A batch whose file exists with the same key
(settings, code and pilot estimates hashes) is finished: a resumed backfill skips it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd


def batch_key(scenario: str, frames: int, batch: int) -> str:
    """Partition key of one batch: ``<scenario>.f<frames>.b<batch>``."""
    return f"{scenario}.f{frames:03d}.b{batch:03d}"


def parse_batch_key(key: str) -> tuple[str, int, int]:
    try:
        scenario, f, b = key.split(".")
        return scenario, int(f.removeprefix("f")), int(b.removeprefix("b"))
    except ValueError:
        raise ValueError(f"power batch key {key!r} is not '<scenario>.f<frames>.b<batch>' (e.g. null.f050.b003)") from None


def batch_path(root: str | Path, family: str, key: str, run_key: str) -> Path:
    """``<root>/<family>/<run_key>/<batch key>.parquet``: ``run_key`` hashes what the labels
    depend on, so a changed setting, code or pilot estimate never mixes with old batches."""
    return Path(root) / family / run_key / f"{key}.parquet"


#: Fixed column types, so every batch file has one schema (a batch without controls has
#: only nulls in ``control_passed``, which Parquet would otherwise type as NULL).
TYPES = {"frames": "int64", "dataset": "int64", "control_passed": "boolean", "converged": "bool",
         "practically_meaningful": "bool", "divergences": "int64"}


def write_batch(path: Path, table: pd.DataFrame) -> Path:
    table = table.astype({k: v for k, v in TYPES.items() if k in table.columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
        table.to_parquet(tmp.name, index=False)
    os.replace(tmp.name, path)
    return path


def read_batches(directory: Path) -> pd.DataFrame:
    """Every finished batch of one family and run key, through DuckDB (read-only, no writer)."""
    import duckdb

    files = sorted(Path(directory).glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    with duckdb.connect() as con:
        return con.execute("select * from read_parquet(?, union_by_name = true) order by scenario, frames, dataset, contrast",
                           [[str(f) for f in files]]).df()
