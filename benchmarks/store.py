"""Multi-writer stores side by side: partitions written per minute with 1, 2 and 4 writers.

Run (from the repository root; the machine is shared, so at low priority):

    nice -n 10 .venv/bin/python benchmarks/store.py --ducklake-python /path/to/python

``--ducklake-python`` is an interpreter with ``duckdb==1.5.5``, ``duckdb-extension-ducklake==1.5.5``,
``duckdb-extension-postgres==1.5.5``, pandas (no DuckLake extension package exists for the
project's DuckDB 2.0, so the DuckLake arm runs in its own environment); without it the
DuckLake arm is reported as not run. Needs Debian's ``postgresql`` (initdb, pg_ctl) for
DuckLake's catalog: a throwaway server on 127.0.0.1 (fear_assets_tests/postgres_server.py).

Stores (each configuration gets a fresh, empty one):
  duckdb    the embedded file through the project's IO manager code (``TransactionalDuckDbClient`` and
            its type handler: connect with dagster-duckdb's retry on a lock, delete + insert in
            one transaction, close). No Dagster pool here: the writers contend for the file as
            they would without one.
  parquet   the multi-writer store through its IO manager code (``ParquetDbClient`` and
            ``ParquetPandasTypeHandler``): one Parquet file per partition, written to a
            temporary name, fsynced, ``os.replace``d.
  The two IO-manager arms call the client and handler as ``DbIOManager.handle_output`` does,
  without Dagster's per-output context (about 0.1-0.3 s a write here, the same for both).
  ducklake  DuckLake with a Postgres catalog and Parquet data files: per write ``BEGIN;
            DELETE ... WHERE part = ?; INSERT ...; COMMIT``, retried on a transaction conflict.

Load. Each writer is its own process and writes its own 4 partitions twice (the second pass
replaces the first), so 8 writes per writer; a partition is 20,000 rows x 5 columns (part,
generation, row_no, value, label), built deterministically (no random draw). The writers
start together (they import and connect first, then wait for a go signal).

Each configuration runs ``--reps`` times (default 3), round-robin over writer counts and
stores so that the shared machine's load falls on every arm alike; the median is reported.

Figures per store and writer count: partitions written per minute (writes / wall from the
first write's start to the last's end x 60), lock errors (DuckDB's "Could not set lock" on
connect, each retried by dagster-duckdb's backoff), transaction conflicts (DuckLake, retried),
failed writes (gave up), and a check afterwards: every partition holds exactly 20,000 rows,
all distinct, all of the second generation. Load average (uptime) before and after.
Writes ``benchmarks/results/store.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = 20_000
PARTS_PER_WRITER = 4
PASSES = 2
WRITERS = tuple(int(x) for x in os.environ.get("FEAR_BENCH_WRITERS", "1,2,4").split(","))
SCHEMA = "two_facts_one_gate"
TABLE = "bench"


def frame(part: str, generation: int):
    import numpy as np
    import pandas as pd

    i = np.arange(ROWS)
    return pd.DataFrame({"part": part, "generation": generation, "row_no": i, "value": i * 0.5 + generation,
                         "label": [f"{part}-{k}" for k in i]})


# ---- workers (one process each) ----

class _StubContext:
    """What the store's client and type handler read from Dagster's OutputContext."""

    has_partition_key = True

    def __init__(self, database: str):
        self.resource_config = {"database": database, "connection_config": {}}

    def add_output_metadata(self, metadata) -> None:
        self.metadata = metadata


def _io_manager_writer(store: str, location: str):
    """The IO manager's own client and type handler, called as DbIOManager.handle_output calls
    them (connect, ensure schema, delete slice, handle output, close) for each write; only
    Dagster's per-output context machinery, the same for both arms, is left out."""
    import duckdb
    from dagster._core.storage.db_io_manager import TableSlice, TablePartitionDimension

    from fear_assets.defs.resources.store import (EmptyAwarePandasTypeHandler, ParquetDbClient, ParquetPandasTypeHandler,
                                             TransactionalDuckDbClient)

    counts = {"lock_errors": 0}
    real_connect = duckdb.connect

    def counting_connect(*a, **k):  # dagster-duckdb's backoff calls duckdb.connect by name
        try:
            return real_connect(*a, **k)
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                counts["lock_errors"] += 1
            raise

    duckdb.connect = counting_connect
    if store == "duckdb":
        client, handler = TransactionalDuckDbClient(), EmptyAwarePandasTypeHandler()
    else:
        client, handler = ParquetDbClient(location), ParquetPandasTypeHandler(location)
    context = _StubContext(location)

    def write(part: str, rows) -> None:
        table_slice = TableSlice(table=TABLE, schema=SCHEMA, partition_dimensions=[
            TablePartitionDimension(partition_expr="part", partitions=[part])])
        with client.connect(context, table_slice) as conn:
            client.ensure_schema_exists(context, table_slice, conn)
            client.delete_table_slice(context, table_slice, conn)
            handler.handle_output(context, table_slice, rows, conn)

    return write, counts


def _ducklake_writer(dsn: str, data_path: str):
    import duckdb

    con = _ducklake_connect(dsn, data_path)
    counts = {"conflicts": 0}

    def write(part: str, f) -> None:  # f: read by DuckDB's replacement scan
        for attempt in range(50):
            con.execute("begin")
            committing = False
            try:
                con.execute(f"delete from lake.{SCHEMA}.{TABLE} where part = ?", [part])
                con.execute(f"insert into lake.{SCHEMA}.{TABLE} select * from f")
                committing = True
                con.execute("commit")  # a failed commit has already rolled back
                return
            except duckdb.Error as e:
                if not committing:
                    con.execute("rollback")
                if "conflict" not in str(e).lower():
                    raise
                counts["conflicts"] += 1
                time.sleep(0.01 * (attempt + 1))
        raise RuntimeError(f"{part}: gave up after 50 conflicts")

    return write, counts


def _ducklake_connect(dsn: str, data_path: str):
    """Load the PyPI-packaged extensions by path (nothing is downloaded) and attach the lake."""
    import duckdb
    import duckdb_extension_ducklake
    import duckdb_extension_postgres

    def ext(mod) -> str:
        return glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", "*", "*.duckdb_extension"))[0]

    con = duckdb.connect()
    # The postgres package names its file postgres.duckdb_extension; DuckDB derives the entry
    # point from the file name, and the extension's name is postgres_scanner.
    links = tempfile.mkdtemp()
    os.symlink(ext(duckdb_extension_postgres), f"{links}/postgres_scanner.duckdb_extension")
    con.execute(f"load '{links}/postgres_scanner.duckdb_extension'")
    con.execute(f"load '{ext(duckdb_extension_ducklake)}'")
    con.execute(f"attach 'ducklake:postgres:{dsn}' as lake (data_path '{data_path}/')")
    return con


def worker(args) -> None:
    parts = [f"p{args.writer * PARTS_PER_WRITER + i:02d}" for i in range(PARTS_PER_WRITER)]
    if args.store == "ducklake":
        write, counts = _ducklake_writer(args.dsn, args.location)
    else:
        write, counts = _io_manager_writer(args.store, args.location)
    # Frames are built before the clock starts: the figure is the store's, not pandas'.
    frames = {(g, p): frame(p, g) for g in range(1, PASSES + 1) for p in parts}
    print("READY", flush=True)
    sys.stdin.readline()  # the go signal
    start, done, failed, errors = time.time(), 0, 0, []
    for generation in range(1, PASSES + 1):
        for part in parts:
            try:
                write(part, frames[generation, part])
                done += 1
            except Exception as e:  # a write that gave up is counted, reported, and the load goes on
                failed += 1
                errors.append(f"{type(e).__name__}: {str(e)[:200]}")
    print(json.dumps({"start": start, "end": time.time(), "writes": done, "failed": failed, "errors": errors[:3],
                      **counts}), flush=True)


def ducklake_admin(args) -> None:
    """--setup: create the empty table; --verify: per-partition counts as JSON."""
    con = _ducklake_connect(args.dsn, args.location)
    if args.admin == "setup":
        con.execute(f"create schema if not exists lake.{SCHEMA}")
        f = frame("p00", 0).head(0)  # noqa: F841
        con.execute(f"create table lake.{SCHEMA}.{TABLE} as select * from f")
        print(json.dumps({"ok": True}))
    else:
        print(json.dumps(_counts(con, f"lake.{SCHEMA}.{TABLE}")))


def _counts(con, table: str) -> list:
    return con.execute(f"select part, count(*), count(distinct row_no), min(generation), max(generation) "
                       f"from {table} group by part order by part").fetchall()


# ---- the driver ----

def _run_config(python: str, store: str, n: int, location: str, dsn: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([python, __file__, "--worker", "--store", store, "--writer", str(w), "--location",
                               location, "--dsn", dsn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for w in range(n)]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "READY":
            raise SystemExit(f"{store} writer did not start: {line}{p.communicate()[0]}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    writes = sum(r["writes"] for r in results)
    return {"writers": n, "writes": writes, "wall_s": round(wall, 2), "partitions_per_min": round(writes / wall * 60, 1),
            "lock_errors": sum(r.get("lock_errors", 0) for r in results),
            "conflicts": sum(r.get("conflicts", 0) for r in results),
            "failed_writes": sum(r["failed"] for r in results), "errors": [e for r in results for e in r["errors"]][:3]}


def _check(counts: list, n: int) -> dict:
    expected = [f"p{i:02d}" for i in range(n * PARTS_PER_WRITER)]
    ok = [c[0] for c in counts] == expected and all(c[1] == c[2] == ROWS and c[3] == c[4] == PASSES for c in counts)
    return {"partitions": len(counts), "rows_ok": ok,
            "rows_lost_or_duplicated": sum(abs(c[1] - ROWS) for c in counts) + ROWS * (len(expected) - len(counts))}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from fear_assets.defs.resources.store import connect_store
    from fear_assets_tests.postgres_server import temporary_postgres

    ap = argparse.ArgumentParser()
    ap.add_argument("--ducklake-python", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "store.json"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[tuple[str, int], list] = {}
    with tempfile.TemporaryDirectory(prefix="fear-store-bench-") as tmp, temporary_postgres(durable=True) as pg:
        # Repetitions round-robin over writer counts and stores, so the shared machine's load
        # falls on every arm alike; the median repetition is reported.
        for rep in range(args.reps):
            for n in WRITERS:
                for store in ("duckdb", "parquet", "ducklake"):
                    if store == "ducklake" and not args.ducklake_python:
                        continue
                    location = str(Path(tmp) / f"{store}-{n}-{rep}")
                    dsn = ""
                    if store == "ducklake":
                        pg.create_database(f"lake{n}_{rep}")
                        dsn = f"dbname=lake{n}_{rep} host={pg.host} port={pg.port} user={pg.user}"
                        Path(location).mkdir()
                        subprocess.run([args.ducklake_python, __file__, "--admin", "setup", "--location", location,
                                        "--dsn", dsn], check=True, capture_output=True, cwd=ROOT)
                    elif store == "duckdb":
                        location += ".duckdb"
                    python = args.ducklake_python if store == "ducklake" else sys.executable
                    row = _run_config(python, store, n, location, dsn)
                    if store == "ducklake":
                        counts = json.loads(subprocess.run(
                            [python, __file__, "--admin", "verify", "--location", location, "--dsn", dsn],
                            check=True, capture_output=True, text=True, cwd=ROOT).stdout)
                    else:
                        with connect_store(store, path=location, root=location) as con:
                            counts = _counts(con, f"{SCHEMA}.{TABLE}")
                    row.update(_check(counts, n), loadavg_1min=round(os.getloadavg()[0], 2))
                    runs.setdefault((store, n), []).append(row)
                    print(f"rep {rep} {store:9s} {n} writer(s): {row['partitions_per_min']:7.1f} partitions/min  "
                          f"lock errors {row['lock_errors']}  conflicts {row['conflicts']}  "
                          f"failed {row['failed_writes']}  rows ok {row['rows_ok']}  load {row['loadavg_1min']}",
                          flush=True)
    results: dict[str, list] = {}
    for store in ("duckdb", "parquet", "ducklake"):
        results[store] = []
        for n in WRITERS:
            reps = runs.get((store, n))
            if not reps:
                results[store].append({"writers": n, "not_run": "no --ducklake-python (needs duckdb 1.5.5 and the "
                                                                 "duckdb-extension-ducklake/-postgres packages)"})
                continue
            rates = sorted(r["partitions_per_min"] for r in reps)
            results[store].append({
                "writers": n, "partitions_per_min_median": rates[len(rates) // 2], "partitions_per_min_all": rates,
                "lock_errors": sum(r["lock_errors"] for r in reps), "conflicts": sum(r["conflicts"] for r in reps),
                "failed_writes": sum(r["failed_writes"] for r in reps), "writes": sum(r["writes"] for r in reps),
                "rows_ok_every_rep": all(r["rows_ok"] for r in reps),
                "rows_lost_or_duplicated": sum(r["rows_lost_or_duplicated"] for r in reps),
                "loadavg_1min": [r["loadavg_1min"] for r in reps], "errors": [e for r in reps for e in r["errors"]][:3]})
    for n_i, n in enumerate(WRITERS):
        base = results["duckdb"][n_i].get("partitions_per_min_median")
        for store in ("parquet", "ducklake"):
            row = results[store][n_i]
            if base and "partitions_per_min_median" in row:
                row["vs_duckdb_file"] = round(row["partitions_per_min_median"] / base, 2)
    versions = {"duckdb (duckdb, parquet arms)": __import__("duckdb").__version__}
    if args.ducklake_python:
        versions["duckdb (ducklake arm)"] = subprocess.run(
            [args.ducklake_python, "-c", "import duckdb; print(duckdb.__version__)"], capture_output=True,
            text=True).stdout.strip()
    out = {"command": "nice -n 10 .venv/bin/python benchmarks/store.py --ducklake-python <python with duckdb 1.5.5>",
           "reps": args.reps, "rows_per_partition": ROWS, "partitions_per_writer": PARTS_PER_WRITER, "passes": PASSES,
           "versions": versions, "loadavg_before": [round(x, 2) for x in load_before],
           "loadavg_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for store, rows in results.items():
        for row in rows:
            print(f"{store:9s} {row['writers']} writer(s): median {row.get('partitions_per_min_median', '-')} "
                  f"partitions/min  x{row.get('vs_duckdb_file', 1.0)} the file  lock errors {row.get('lock_errors', '-')}  "
                  f"conflicts {row.get('conflicts', '-')}  rows ok {row.get('rows_ok_every_rep', '-')}")
    print(f"wrote {args.out}; load average before {out['loadavg_before']}, after {out['loadavg_after']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--admin", choices=["setup", "verify"])
    ap.add_argument("--store")
    ap.add_argument("--writer", type=int, default=0)
    ap.add_argument("--location")
    ap.add_argument("--dsn", default="")
    known, _ = ap.parse_known_args()
    if known.worker:
        worker(known)
    elif known.admin:
        ducklake_admin(known)
    else:
        main()
