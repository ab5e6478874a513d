"""Atomic file writes: a path holds its old content or all of the new, never half of it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import duckdb
import pandas as pd


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_parquet_atomically(frame: pd.DataFrame, path: Path, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Write ``frame`` to ``path`` so that ``path`` holds either its old content or all of the new.

    Temporary name in the same directory (same filesystem, so the rename is atomic; hidden and
    not ``*.parquet``, so readers' globs skip it), fsync of the file, ``os.replace``, fsync of the
    directory (so the rename itself survives a crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    own = con is None
    con = duckdb.connect() if own else con
    try:
        con.register("fear_frame", frame)
        con.execute(f"copy (select * from fear_frame) to '{sql_path(tmp)}' (format parquet)")
        con.unregister("fear_frame")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if own:
            con.close()
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def sql_path(path: Path | str) -> str:
    return str(path).replace("'", "''")
