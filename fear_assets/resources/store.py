"""The DuckDB store: every asset table lives in one DuckDB file (path configurable).

The stock dagster-duckdb client deletes a partition's rows and inserts the new ones as two
auto-committed statements, so a failed insert would lose the old rows. Our client wraps
each connection in one transaction: a partition is replaced entirely or not at all.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from dagster._core.storage.db_io_manager import DbIOManager
from dagster_duckdb.io_manager import DuckDbClient, _get_cleanup_statement
from dagster_duckdb_pandas import DuckDBPandasIOManager, DuckDBPandasTypeHandler

from fear_assets.settings import DEFAULT_DUCKDB_PATH

DUCKDB_ENV = "FEAR_ASSETS_DUCKDB"
SCHEMA = "two_facts_one_gate"  # one schema per protocol (code location)


def duckdb_path() -> str:
    """``$FEAR_ASSETS_DUCKDB`` if set, else ``data/fear_assets.duckdb``."""
    return os.environ.get(DUCKDB_ENV, str(DEFAULT_DUCKDB_PATH))


class TransactionalDuckDbClient(DuckDbClient):
    """DuckDbClient whose every connection is one transaction (commit or roll back)."""

    @staticmethod
    @contextmanager
    def connect(context, table_slice):
        with DuckDbClient.connect(context, table_slice) as conn:
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
