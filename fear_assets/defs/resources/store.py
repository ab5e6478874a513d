"""The stores: the embedded DuckDB file (the default) and a multi-writer Parquet store.

Embedded: every asset table lives in one DuckDB file (path configurable). The stock
dagster-duckdb client deletes a partition's rows and inserts the new ones as two auto-committed
statements, so a failed insert would lose the old rows. Our client wraps each connection in
one transaction: a partition is replaced entirely or not at all.

Multi-writer (issue 17, below): one Parquet file per partition, replaced atomically. The same
IO manager (``StoreIOManager``) serves both; ``store`` in its config or ``$FEAR_ASSETS_STORE``
picks one, and ``connect_store`` reads the same table names from either.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import duckdb
import filelock
import pandas as pd
from dagster import DagsterInvariantViolationError, InputContext, MetadataValue, TableColumn, TableSchema, TimeWindow
# The database I/O manager's extension points (client, table slice) and the table metadata
# set have no public name; dagster-duckdb itself is built on these same modules.
from dagster._core.definitions.metadata import TableMetadataSet
from dagster._core.storage.db_io_manager import DbClient, DbIOManager, TableSlice
from dagster_duckdb.io_manager import DuckDbClient, _get_cleanup_statement
from dagster_duckdb_pandas import DuckDBPandasIOManager, DuckDBPandasTypeHandler
from pydantic import Field

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.files import sql_path, write_parquet_atomically
from fear_assets.core.settings import DEFAULT_DUCKDB_PATH
from fear_assets.core.site import SiteConfig, load_site

DUCKDB_ENV = "FEAR_ASSETS_DUCKDB"
SCHEMA = "two_facts_one_gate"  # one schema per protocol (code location)


def _site(site: SiteConfig | None) -> SiteConfig:
    return site if site is not None else load_site()


def duckdb_path(site: SiteConfig | None = None) -> str:
    """``$FEAR_ASSETS_DUCKDB`` if set, else the site configuration's ``store.duckdb_path``
    (``site``, default ``$FEAR_ASSETS_SITE``), else ``data/fear_assets.duckdb``."""
    if DUCKDB_ENV in os.environ:
        return os.environ[DUCKDB_ENV]
    return str(_site(site).store.duckdb_path or DEFAULT_DUCKDB_PATH)


class StoreLockedError(FearAssetsError):
    """The embedded DuckDB file is held by another writing process (issue 16)."""


@contextmanager
def _lock_named(database: str) -> Iterator[None]:
    """A second process writing the embedded file: DuckDB refuses the lock (after the stock
    client's retries, about 100 s); say which file, who holds it and what to change."""
    try:
        yield
    except duckdb.IOException as exc:
        if "lock" not in str(exc).lower():
            raise
        raise StoreLockedError(
            f"the DuckDB store {database} is held by another writing process ({exc}). The embedded store admits "
            "one writer at a time: run every writing step in the 'duckdb' pool with its default limit of 1 "
            "(dagster.yaml concurrency.pools), wait for the other process, or use the multi-writer Parquet store "
            f"({STORE_ENV}=parquet). Nothing was written") from exc


#: How long a step waits for another step's turn on the embedded file before it gives up
#: (a write takes seconds; ten minutes means the other holder is stuck, not busy).
WRITER_LOCK_TIMEOUT_S = 600.0


def writer_lock_path(database: str) -> str | None:
    """The file beside the embedded store that its writers queue on (None for ``:memory:``)."""
    return None if database == ":memory:" else f"{database}.writer.lock"


def _step_log(context):
    try:
        return context.log
    except DagsterInvariantViolationError:  # a context built by hand in a test carries no log
        return None


@contextmanager
def _one_writer_at_a_time(database: str, log) -> Iterator[None]:
    """Hold the embedded file's writer lock for one connection.

    The ``duckdb`` pool (limit 1) is what keeps a backfill's steps off the file together, but
    Dagster's pools on Postgres claim a slot in separate auto-committed statements (check the
    free slots, then add the step as assigned), so two steps that ask in the same instant can
    both be admitted; a CI run of ``test_store_concurrency`` saw it. DuckDB then refuses the
    second process and the stock client retries with back-off. This OS-level lock (``filelock``,
    released by the kernel if the process dies) makes the writers queue instead, whatever the
    pool does: the guarantee "one writer at a time" lives next to the file it protects."""
    path = writer_lock_path(database)
    if path is None:
        yield
        return
    lock = filelock.FileLock(path, timeout=WRITER_LOCK_TIMEOUT_S)
    asked = time.monotonic()
    try:
        lock.acquire()
    except filelock.Timeout as exc:
        raise StoreLockedError(
            f"the DuckDB store {database} stayed held by another step for {WRITER_LOCK_TIMEOUT_S:.0f} s (its lock "
            f"file {path}). The embedded store admits one writer at a time: find the stuck run in the Dagster UI "
            f"and terminate it, or use the multi-writer Parquet store ({STORE_ENV}=parquet). Nothing was written"
        ) from exc
    waited = time.monotonic() - asked
    if log is not None:
        # the concurrent-writer test reads these two lines to time each write's turn on the file
        (log.info if waited >= 1.0 else log.debug)(f"STORE_TURN_BEGIN {database} after waiting {waited:.1f} s "
                                                   "for another writer")
    try:
        yield
    finally:
        lock.release()
        if log is not None:
            log.debug(f"STORE_TURN_END {database}")


class TransactionalDuckDbClient(DuckDbClient):
    """DuckDbClient whose every connection is one transaction (commit or roll back), taken
    in turn with the other steps writing the same file (``_one_writer_at_a_time``)."""

    @staticmethod
    @contextmanager
    def connect(context, table_slice):
        database = context.resource_config["database"]
        with (_one_writer_at_a_time(database, _step_log(context)), _lock_named(database),
              DuckDbClient.connect(context, table_slice) as conn):
            conn.execute("BEGIN TRANSACTION")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                conn.close()  # the stock client closes only on success; never leak the file lock
                raise
            conn.execute("COMMIT")

    @staticmethod
    def delete_table_slice(context, table_slice, connection) -> None:
        # Inside a transaction a failed DELETE (table not created yet) would abort it, so
        # look the table up instead of catching the error as the stock client does.
        exists = connection.execute(
            "select count(*) from information_schema.tables where table_schema = ? and table_name = ?",
            [table_slice.schema, table_slice.table],
        ).fetchone()[0]
        if exists:
            connection.execute(_get_cleanup_statement(table_slice))


class EmptyAwarePandasTypeHandler(DuckDBPandasTypeHandler):
    """The stock handler skips an empty DataFrame without creating its table, so a
    downstream read of a legitimately empty output (e.g. no base checkpoint) would fail;
    this one creates the table from the frame's columns first."""

    def handle_output(self, context, table_slice, obj, connection):
        if obj is not None and obj.empty and len(obj.columns):
            connection.execute(f"create table if not exists {table_slice.schema}.{table_slice.table} "
                               "as select * from obj limit 0")
        return super().handle_output(context, table_slice, obj, connection)


class TransactionalDuckDBPandasIOManager(DuckDBPandasIOManager):
    """DuckDB pandas IO manager that replaces a partition in one transaction."""

    @staticmethod
    def type_handlers():
        return [EmptyAwarePandasTypeHandler()]

    def create_io_manager(self, context) -> DbIOManager:
        return DbIOManager(
            db_client=TransactionalDuckDbClient(),
            database=self.database,
            schema=self.schema_,
            type_handlers=self.type_handlers(),
            default_load_type=self.default_load_type(),
            io_manager_name="DuckDBIOManager",
        )


def duckdb_io_manager(path: str | None = None) -> TransactionalDuckDBPandasIOManager:
    return TransactionalDuckDBPandasIOManager(database=path or duckdb_path(), schema=SCHEMA)


# --- The multi-writer store: one Parquet file per partition, replaced atomically (issue 17) ---
#
# The embedded DuckDB file above admits one writing process, so a cluster that scores several
# partitions at once needs another store. This one keeps every asset table as a directory of
# Parquet files, one file per partition (``<root>/<schema>/<table>/depth=<d>/family=<f>/data.parquet``, dimensions sorted;
# an unpartitioned table is ``<root>/<schema>/<table>/data.parquet``). A write renders the
# partition to a temporary name in the same directory, fsyncs it and ``os.replace``s it over
# the old file: POSIX rename is atomic, so a reader sees the old rows or the new rows, never
# neither nor both, and writers of different partitions touch different files (no lock at all).
# Reads go through DuckDB views over ``read_parquet``, so a query names the same
# ``two_facts_one_gate.<table>`` on either store. Selected by ``FEAR_ASSETS_STORE=parquet``
# (root ``FEAR_ASSETS_PARQUET_ROOT``) or by the IO manager's resource config ``store: parquet``.


STORE_ENV = "FEAR_ASSETS_STORE"
PARQUET_ROOT_ENV = "FEAR_ASSETS_PARQUET_ROOT"
DEFAULT_PARQUET_ROOT = DEFAULT_DUCKDB_PATH.parent / "parquet"
STORES = ("duckdb", "parquet")
PARTITION_FILE = "data.parquet"


def store_kind(site: SiteConfig | None = None) -> str:
    """``$FEAR_ASSETS_STORE`` (``duckdb`` or ``parquet``) if set, else the site configuration's
    ``store.kind`` (default ``duckdb``)."""
    kind = os.environ[STORE_ENV] if STORE_ENV in os.environ else _site(site).store.kind
    if kind not in STORES:
        raise ValueError(f"{STORE_ENV}={kind!r}: the store must be one of {', '.join(STORES)}; "
                         f"unset it for the embedded DuckDB file")
    return kind


def parquet_root(site: SiteConfig | None = None) -> str:
    """``$FEAR_ASSETS_PARQUET_ROOT`` if set, else the site configuration's ``store.parquet_root``,
    else ``data/parquet``."""
    if PARQUET_ROOT_ENV in os.environ:
        return os.environ[PARQUET_ROOT_ENV]
    return str(_site(site).store.parquet_root or DEFAULT_PARQUET_ROOT)


def table_dir(root: str | Path, schema: str, table: str) -> Path:
    return Path(root) / schema / table


def partition_file(root: str | Path, schema: str, table: str, keys: Sequence[tuple[str, str]]) -> Path:
    """The one file holding a partition: a hive-style directory per dimension (sorted by column)."""
    d = table_dir(root, schema, table)
    for column, key in sorted(keys):
        d = d / f"{quote(column, safe='')}={quote(str(key), safe='')}"
    return d / PARTITION_FILE


#: Between the parts of a partition key that stands for several columns ("d1|smollm2-135m").
KEY_SEPARATOR = "|"
_JOINED = re.compile(r"\(\s*(\w+(?:\s*\|\|\s*'\|'\s*\|\|\s*\w+)+)\s*\)")


def joined_key_expr(columns: Sequence[str]) -> str:
    """The ``partition_expr`` of a partition whose key joins several stored columns with
    ``KEY_SEPARATOR`` ("(depth || '|' || family)"): both stores select and replace by it, and
    the Parquet store splits the key back into its columns (``joined_key_columns``)."""
    return "(" + f" || '{KEY_SEPARATOR}' || ".join(columns) + ")"


def joined_key_columns(partition_expr: str) -> tuple[str, ...] | None:
    """The columns of a ``joined_key_expr`` (None for a plain column name)."""
    match = _JOINED.fullmatch(partition_expr.strip())
    if match is None:
        return None
    return tuple(c.strip() for c in match.group(1).split(f"|| '{KEY_SEPARATOR}' ||"))


def _dimension_keys(table: str, partition_expr: str, key: str) -> tuple[tuple[str, str], ...]:
    """The (column, value) pairs one key of one dimension stands for."""
    columns = joined_key_columns(partition_expr)
    if columns is None:
        return ((partition_expr, key),)
    values = key.split(KEY_SEPARATOR)
    if len(values) != len(columns):
        raise ValueError(f"table {table}: partition key {key!r} does not have one part per column of "
                         f"{partition_expr} ({', '.join(columns)})")
    return tuple(zip(columns, values))


def _slice_keys(table_slice: TableSlice) -> list[tuple[tuple[str, str], ...]]:
    """Every (column, key) combination a write covers: the product of each dimension's keys,
    exactly the rows the embedded store's ``col in (...) and ...`` delete would cover. A key
    of a joined expression (``joined_key_expr``) is split into its columns."""
    dims = []
    for dim in table_slice.partition_dimensions or ():
        if isinstance(dim.partitions, TimeWindow):
            raise NotImplementedError(f"table {table_slice.table}: the Parquet store keeps static partitions only; "
                                      "time-window partitions need the embedded DuckDB store")
        dims.append([_dimension_keys(table_slice.table, dim.partition_expr, str(k)) for k in dim.partitions])
    return [sum(parts, ()) for parts in itertools.product(*dims)] if dims else [()]


def split_by_partition(frame: pd.DataFrame, table: str,
                       combos: Sequence[tuple[tuple[str, str], ...]]) -> dict[tuple[tuple[str, str], ...], pd.DataFrame]:
    """The rows of ``frame`` belonging to each partition; every row must belong to one."""
    if combos == [()]:
        return {(): frame}
    columns = {c for combo in combos for c, _ in combo}
    missing = sorted(columns - set(frame.columns))
    if missing:
        raise ValueError(f"table {table}: partition_expr column(s) {missing} are not columns of the output; "
                         "the Parquet store needs partition_expr to name a column (as fear_assets.defs.partitions does)")
    as_text = {c: frame[c].astype(str) for c in columns}
    parts, claimed = {}, pd.Series(False, index=frame.index)
    for combo in combos:
        mask = pd.Series(True, index=frame.index)
        for column, key in combo:
            mask &= as_text[column] == key
        parts[combo] = frame[mask]
        claimed |= mask
    if not claimed.all():
        stray = frame.loc[~claimed, sorted(columns)].drop_duplicates().head(3).to_dict("records")
        raise ValueError(f"table {table}: {int((~claimed).sum())} output rows lie outside the partition(s) being "
                         f"written (e.g. {stray}); fix the asset so it returns only its own partition's rows")
    return parts


def write_table_slice(root: str | Path, table_slice: TableSlice, frame: pd.DataFrame,
                      con: duckdb.DuckDBPyConnection | None = None) -> int:
    """Replace the slice's partitions with ``frame``'s rows (one atomic file each); return files written.

    A frame with no columns (nothing to store) removes the slice's files: the same as the
    embedded store's delete followed by no insert."""
    combos = _slice_keys(table_slice)
    if not len(frame.columns):
        for combo in combos:
            partition_file(root, table_slice.schema, table_slice.table, combo).unlink(missing_ok=True)
        return 0
    parts = split_by_partition(frame, table_slice.table, combos)
    for combo, rows in parts.items():
        write_parquet_atomically(rows.reset_index(drop=True),
                                 partition_file(root, table_slice.schema, table_slice.table, combo), con)
    return len(parts)


def create_views(con: duckdb.DuckDBPyConnection, root: str | Path, schema: str,
                 tables: Sequence[str] | None = None) -> list[str]:
    """Views ``<schema>.<table>`` over each table's Parquet files (all tables when ``tables`` is None).

    ``union_by_name`` so partitions written before and after a column was added still read;
    the partition columns are in the files themselves, so hive parsing of the paths is off."""
    con.execute(f"create schema if not exists {schema}")
    base = Path(root) / schema
    names = tables if tables is not None else (sorted(p.name for p in base.iterdir() if p.is_dir())
                                               if base.is_dir() else [])
    made = []
    for name in names:
        d = base / name
        if not d.is_dir() or next(d.rglob("*.parquet"), None) is None:
            continue
        con.execute(f"create or replace view {schema}.{name} as select * from read_parquet("
                    f"'{sql_path(d)}/**/*.parquet', union_by_name = true, hive_partitioning = false)")
        made.append(name)
    return made


class ParquetDbClient(DbClient):
    """DbClient over the Parquet dataset: a private in-memory DuckDB per call, with views."""

    def __init__(self, root: str):
        self.root = root

    @contextmanager
    def connect(self, context, table_slice) -> Iterator[duckdb.DuckDBPyConnection]:
        con = duckdb.connect()
        try:
            if isinstance(context, InputContext):  # a write needs no view (and would read every file's footer)
                create_views(con, self.root, table_slice.schema, [table_slice.table])
            yield con
        finally:
            con.close()

    @staticmethod
    def ensure_schema_exists(context, table_slice, connection) -> None:
        connection.execute(f"create schema if not exists {table_slice.schema}")

    @staticmethod
    def delete_table_slice(context, table_slice, connection) -> None:
        # Nothing to delete first: the write replaces each partition's file atomically.
        return None

    @staticmethod
    def get_select_statement(table_slice: TableSlice) -> str:
        return DuckDbClient.get_select_statement(table_slice)


class ParquetPandasTypeHandler(DuckDBPandasTypeHandler):
    """Writes a DataFrame as one Parquet file per partition; reads like the DuckDB handler."""

    def __init__(self, root: str):
        self.root = root

    def handle_output(self, context, table_slice, obj, connection):
        write_table_slice(self.root, table_slice, obj, connection)
        rows = TableMetadataSet(partition_row_count=obj.shape[0], storage_kind="parquet") if context.has_partition_key \
            else TableMetadataSet(row_count=obj.shape[0], storage_kind="parquet")
        context.add_output_metadata({
            **rows,
            "dataframe_columns": MetadataValue.table_schema(
                TableSchema(columns=[TableColumn(name=str(n), type=str(t)) for n, t in obj.dtypes.items()])),
        })


class StoreIOManager(TransactionalDuckDBPandasIOManager):
    """The project's IO manager: ``store: duckdb`` (default, the embedded file, one writer) or
    ``store: parquet`` (one atomically replaced Parquet file per partition, many writers).
    Asset code is the same on both; only this resource's configuration differs."""

    store: str = Field(default="duckdb", description="duckdb (the embedded file) or parquet (multi-writer)")
    parquet_root: str | None = Field(default=None, description="root directory of the Parquet store")

    def create_io_manager(self, context) -> DbIOManager:
        if self.store == "duckdb":
            return super().create_io_manager(context)
        if self.store != "parquet":
            raise ValueError(f"io_manager config store={self.store!r}: use 'duckdb' or 'parquet'")
        root = self.parquet_root or parquet_root()
        return DbIOManager(db_client=ParquetDbClient(root), database=root, schema=self.schema_,
                           type_handlers=[ParquetPandasTypeHandler(root)], default_load_type=pd.DataFrame,
                           io_manager_name="ParquetIOManager")


def store_io_manager(path: str | None = None, store: str | None = None, root: str | None = None,
                     site: SiteConfig | None = None) -> StoreIOManager:
    """The IO manager the definitions use: the embedded DuckDB file unless ``$FEAR_ASSETS_STORE``,
    the site configuration's ``store.kind`` (``site``, default ``$FEAR_ASSETS_SITE``) or ``store``
    says ``parquet``."""
    site = _site(site)
    return StoreIOManager(database=path or duckdb_path(site), schema=SCHEMA, store=store or store_kind(site),
                          parquet_root=root or parquet_root(site))


@contextmanager
def connect_store(store: str | None = None, path: str | None = None,
                  root: str | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only DuckDB connection where ``two_facts_one_gate.<table>`` reads either store."""
    if (store or store_kind()) == "duckdb":
        con = duckdb.connect(path or duckdb_path(), read_only=True)
    else:
        con = duckdb.connect()
        create_views(con, root or parquet_root(), SCHEMA)
    try:
        yield con
    finally:
        con.close()


def store_location(io_manager: DbIOManager) -> tuple[str, str | None, str | None]:
    """(store, DuckDB path, Parquet root) of the IO manager a step runs with: the one place that
    reads where the running IO manager keeps its tables (the DuckDB path, or our Parquet client's root)."""
    root = getattr(getattr(io_manager, "_db_client", None), "root", None)
    return ("parquet" if root else "duckdb"), getattr(io_manager, "_database", None), root


def read_table(io_manager: DbIOManager, table: str, family: str | None = None) -> pd.DataFrame | None:
    """The stored rows of asset table ``table`` (one family's where ``family`` is given and the
    table has a ``family`` column), read from the store ``io_manager`` writes (DuckDB file or
    Parquet tree); None where nothing is stored yet or the asset is not materialised."""
    store, path, root = store_location(io_manager)
    if not root and not Path(str(path or "")).is_file():
        return None  # nothing stored yet
    with connect_store(store=store, path=path, root=root) as con:
        exists = con.execute("select count(*) from information_schema.tables where table_schema = ? and "
                             "table_name = ?", [SCHEMA, table]).fetchone()[0]
        if not exists:
            return None
        columns = {r[0] for r in con.execute("select column_name from information_schema.columns where "
                                             "table_schema = ? and table_name = ?", [SCHEMA, table]).fetchall()}
        where = " where family = ?" if family is not None and "family" in columns else ""
        return con.execute(f"select * from {SCHEMA}.{table}{where}", [family] if where else []).df()
