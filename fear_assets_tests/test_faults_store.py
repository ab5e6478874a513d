"""Fault injection, the store (issue 16): a full disk during a write keeps the previous rows
(on both stores, and for a scoring chunk); a second process writing the embedded DuckDB file
at once is waited for, or refused with a clear message, and no write is lost.

A full disk is injected as ``OSError(ENOSPC)`` at the write call (robust anywhere, root
included: root ignores a read-only chmod), and, where this machine lets the test mount one,
for real on a 2 MiB tmpfs.
"""



import errno
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import pytest

from fear_assets.defs.resources import store
from fear_assets.defs.resources.store import SCHEMA, StoreLockedError, partition_file, store_io_manager

from fear_assets_tests.faults import record

pytestmark = pytest.mark.faults

PARTS = dg.StaticPartitionsDefinition(["a", "b"])
FULL = "disk full during a write"


class Rows(dg.Config):
    n: int = 50
    generation: str = "old"
    width: int = 8


@dg.asset(partitions_def=PARTS, metadata={"partition_expr": "part"})
def ledger(context: dg.AssetExecutionContext, config: Rows) -> pd.DataFrame:
    # Hex digests: a payload that compression cannot shrink below what the full disk refuses.
    payload = [hashlib.sha256(f"{config.generation}{i}".encode()).hexdigest()[:config.width] for i in range(config.n)]
    return pd.DataFrame({"part": context.partition_key, "row": range(config.n), "generation": config.generation,
                         "payload": payload})


def _write(io_manager, part: str, **config) -> dg.ExecuteInProcessResult:
    return dg.materialize([ledger], partition_key=part, resources={"io_manager": io_manager},
                          run_config={"ops": {"ledger": {"config": config}}}, raise_on_error=False)


def _read(kind: str, where: Path) -> pd.DataFrame:
    if kind == "duckdb":
        con = duckdb.connect(str(where), read_only=True)
    else:
        con = duckdb.connect()
        store.create_views(con, where, SCHEMA, ["ledger"])
    try:
        return con.execute(f"select * from {SCHEMA}.ledger order by part, row").df()
    finally:
        con.close()


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device (injected)")


def _io(kind: str, where: Path):
    return store_io_manager(path=str(where), store="duckdb") if kind == "duckdb" else \
        store_io_manager(store="parquet", root=str(where))


@pytest.mark.parametrize("kind", ["duckdb", "parquet"])
def test_a_full_disk_during_a_write_keeps_the_previous_rows(kind, tmp_path, monkeypatch):
    where = tmp_path / ("store.duckdb" if kind == "duckdb" else "parquet")
    io = _io(kind, where)
    assert _write(io, "a", n=50).success and _write(io, "b", n=7).success
    before = _read(kind, where)
    injected = survived = lost = 0
    # Where the bytes go: DuckDB's insert inside the transaction (after the old rows' delete);
    # the Parquet store's fsync of its temporary file, then its rename.
    points = (["insert"] if kind == "duckdb" else ["fsync", "replace"])
    for point in points:
        with monkeypatch.context() as m:
            if point == "insert":
                original = store.EmptyAwarePandasTypeHandler.handle_output

                def full_after_insert(self, context, table_slice, obj, connection):
                    original(self, context, table_slice, obj, connection)  # the new rows are in, uncommitted
                    _no_space()

                m.setattr(store.EmptyAwarePandasTypeHandler, "handle_output", full_after_insert)
            elif point == "fsync":
                m.setattr(store.os, "fsync", _no_space)
            else:
                m.setattr(store.os, "replace", _no_space)
            result = _write(io, "a", n=80, generation="new")
        injected += 1
        after = _read(kind, where)
        kept = after.equals(before)
        lost += len(before) - len(after.merge(before))
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        named = failure is not None and "No space left on device" in str(failure.event_specific_data.error)
        leftovers = [p.name for p in where.parent.rglob("*.tmp")] if kind == "parquet" else []
        survived += (not result.success) and kept and named and not leftovers
    # With space again the write goes through.
    assert _write(io, "a", n=80, generation="new").success
    now = _read(kind, where)
    record(FULL, injected, survived, rows_lost=lost)
    assert survived == injected and lost == 0
    assert (now[now.part == "a"].generation == "new").all() and len(now[now.part == "a"]) == 80
    assert now[now.part == "b"].reset_index(drop=True).equals(before[before.part == "b"].reset_index(drop=True))


def test_a_full_disk_while_a_chunk_is_written_keeps_the_finished_chunks(tmp_path, monkeypatch):
    from fear_assets.lm.resumable import score_resumably
    from fear_assets.design.requests import DocumentRequest

    requests = [DocumentRequest(key=f"doc{i}", reader="tested", trial_ids=[f"doc{i}"], branches={"report": f"t{i}"})
                for i in range(7)]
    scored: list[str] = []

    def score(reqs, _):
        scored.extend(r.key for r in reqs)
        long = pd.DataFrame([{"request": r.key, "branch": "report", "label": "x", "mean_logprob": -float(i),
                              "sum_logprob": -2.0 * i, "n_tokens": 2, "greedy": False} for i, r in enumerate(reqs)])
        readouts = pd.DataFrame([{"request": r.key, "reader": "tested", "n_tokens": 3, "excluded_context": False,
                                  "exclusion_reason": "", "feature_row": i} for i, r in enumerate(reqs)])
        return long, readouts, np.arange(len(reqs) * 4, dtype=np.float32).reshape(len(reqs), 4)

    whole = score_resumably(requests, score, tmp_path / "whole", "salt", chunk_documents=3)
    calls = {"n": 0}
    real_fsync = os.fsync

    def full_on_the_second_chunk(fd):
        calls["n"] += 1
        if calls["n"] == 3:  # file + directory of chunk 0, then chunk 1's file
            _no_space()
        return real_fsync(fd)

    scored.clear()
    with monkeypatch.context() as m:
        m.setattr(store.os, "fsync", full_on_the_second_chunk)
        with pytest.raises(OSError, match="No space left"):
            score_resumably(requests, score, tmp_path / "cut", "salt", chunk_documents=3)
    files = sorted(p.name for p in (tmp_path / "cut").iterdir())
    scored.clear()
    resumed = score_resumably(requests, score, tmp_path / "cut", "salt", chunk_documents=3)
    ok = (len(files) == 1 and files[0].startswith("chunk-") and scored == [f"doc{i}" for i in range(3, 7)]
          and resumed.readouts.equals(whole.readouts) and resumed.long.equals(whole.long)
          and resumed.features.tobytes() == whole.features.tobytes())
    record(FULL + " (scoring chunk)", 1, int(ok), rows_lost=len(whole.readouts) - len(resumed.readouts))
    assert ok, (files, scored)


@pytest.fixture
def tmpfs(tmp_path):
    """A real 2 MiB filesystem, where the machine lets a test mount one (root in a container
    with CAP_SYS_ADMIN); otherwise the injected ENOSPC tests above stand alone."""
    target = tmp_path / "small"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(target)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:120]}); the injected ENOSPC tests cover it")
    yield target
    subprocess.run(["umount", str(target)], check=False)


def test_a_really_full_filesystem_keeps_the_previous_rows(tmpfs):
    io = _io("parquet", tmpfs / "parquet")
    assert _write(io, "a", n=50).success
    before = _read("parquet", tmpfs / "parquet")
    filler = tmpfs / "filler"
    with open(filler, "wb") as f:  # leave about 64 KiB free
        free = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize
        f.write(b"\0" * max(0, free - 64 * 1024))
    result = _write(io, "a", n=20_000, generation="new", width=64)  # ~1.3 MB: cannot fit
    after = _read("parquet", tmpfs / "parquet")
    leftovers = [p.name for p in tmpfs.rglob("*.tmp")]
    survived = (not result.success) and after.equals(before) and not leftovers
    record(FULL + " (real tmpfs)", 1, int(survived), rows_lost=len(before) - len(after.merge(before)))
    assert survived, (result.success, leftovers)
    filler.unlink()
    assert _write(io, "a", n=20_000, generation="new", width=64).success
    assert len(_read("parquet", tmpfs / "parquet")) == 20_000
    assert partition_file(tmpfs / "parquet", SCHEMA, "ledger", [("part", "a")]).is_file()


# --- two processes writing the embedded DuckDB file -------------------------------------------

HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("create table if not exists holder_writes (written double)")
con.execute("begin transaction")
con.execute("insert into holder_writes values (?)", [time.time()])
print("HOLDING", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("commit")
con.close()
print("RELEASED", flush=True)
"""


def _holder(db: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line == "HOLDING", proc.stderr.read()[-2000:]
    return proc


def test_a_second_writer_waits_for_the_first_and_no_write_is_lost(tmp_path):
    db = tmp_path / "store.duckdb"
    io = _io("duckdb", db)
    assert _write(io, "a", n=5).success
    holder = _holder(db, 1.5)  # another process holds the file (a pool misconfigured: two writers at once)
    started = time.monotonic()
    result = _write(io, "b", n=9, generation="second")
    waited = time.monotonic() - started
    holder.wait(timeout=30)
    rows = _read("duckdb", db)
    con = duckdb.connect(str(db), read_only=True)
    holder_rows = con.execute("select count(*) from holder_writes").fetchone()[0]
    con.close()
    survived = result.success and waited >= 1.0 and holder_rows == 1 and len(rows) == 14
    record("two processes writing the DuckDB store at once", 1, int(survived),
           rows_lost=(1 - holder_rows) + (14 - len(rows)))
    assert survived, (result.success, waited, holder_rows, len(rows))


def test_a_second_writer_that_cannot_wait_fails_with_a_clear_message_and_loses_nothing(tmp_path, monkeypatch):
    import dagster_duckdb.io_manager as stock

    db = tmp_path / "store.duckdb"
    io = _io("duckdb", db)
    assert _write(io, "a", n=5).success
    real_backoff = stock.backoff
    # The stock client retries for about 100 s; two quick retries show the same refusal.
    monkeypatch.setattr(stock, "backoff", lambda **kw: real_backoff(**{**kw, "max_retries": 2}))
    holder = _holder(db, 30)
    try:
        result = _write(io, "a", n=9, generation="second")
    finally:
        holder.terminate()
        holder.wait(timeout=30)
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = str(failure.event_specific_data.error)
    rows = _read("duckdb", db)
    clear = StoreLockedError.__name__ in message and "one writer at a time" in message and str(db) in message
    survived = (not result.success) and clear and len(rows) == 5 and (rows.generation == "old").all()
    record("two processes writing the DuckDB store at once (no wait)", 1, int(survived), rows_lost=5 - len(rows))
    assert survived, message[:1000]
    assert _write(io, "a", n=9, generation="second").success  # the holder gone, the write goes through
