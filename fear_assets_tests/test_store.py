"""The two stores behind one IO manager (issue 17): same asset code, same table names, and a
partition replaced entirely or not at all on the Parquet store."""

import os

import dagster as dg
import pandas as pd
import pytest

from fear_assets.defs.resources.store import (SCHEMA, STORE_ENV, StoreIOManager, connect_store, partition_file,
                                         store_io_manager, write_parquet_atomically)

family_depth = dg.MultiPartitionsDefinition({"family": dg.StaticPartitionsDefinition(["a", "b"]),
                                             "depth": dg.StaticPartitionsDefinition(["d1", "d2"])})


class Rows(dg.Config):
    n: int = 3
    stray: bool = False


@dg.asset(partitions_def=family_depth, metadata={"partition_expr": {"family": "family", "depth": "depth"}})
def cells(context: dg.AssetExecutionContext, config: Rows) -> pd.DataFrame:
    k = context.partition_key.keys_by_dimension
    family = "zz" if config.stray else k["family"]
    return pd.DataFrame({"family": family, "depth": k["depth"], "x": range(config.n)})


@dg.asset(partitions_def=dg.StaticPartitionsDefinition(["a", "b"]), metadata={"partition_expr": "family"},
          ins={"cells": dg.AssetIn(partition_mapping=dg.MultiToSingleDimensionPartitionMapping(
              partition_dimension_name="family"))})
def per_family(context: dg.AssetExecutionContext, cells: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"family": [context.partition_key], "rows": [len(cells)]})


@dg.asset
def empty_table() -> pd.DataFrame:
    return pd.DataFrame({"q": pd.Series([], dtype="int64")})


def _materialize_all(io_manager, n: int = 3) -> None:
    for f in "ab":
        for d in ("d1", "d2"):
            result = dg.materialize([cells], partition_key=dg.MultiPartitionKey({"family": f, "depth": d}),
                                    resources={"io_manager": io_manager},
                                    run_config={"ops": {"cells": {"config": {"n": n}}}})
            assert result.success
    for f in "ab":
        assert dg.materialize([cells, per_family], selection=[per_family], partition_key=f,
                              resources={"io_manager": io_manager}).success
    assert dg.materialize([empty_table], resources={"io_manager": io_manager}).success


QUERY = (f"select c.family, c.depth, count(*) as n, any_value(p.rows) as family_rows from {SCHEMA}.cells c "
         f"join {SCHEMA}.per_family p using (family) group by all order by all")


def test_same_asset_code_gives_the_same_tables_on_both_stores(tmp_path):
    db, root = str(tmp_path / "x.duckdb"), str(tmp_path / "parquet")
    _materialize_all(store_io_manager(path=db, store="duckdb"))
    _materialize_all(store_io_manager(path=db, store="parquet", root=root))
    with connect_store("duckdb", path=db) as con:
        embedded = con.execute(QUERY).fetchall()
        assert con.execute(f"select count(*) from {SCHEMA}.empty_table").fetchone() == (0,)
    with connect_store("parquet", root=root) as con:
        parquet = con.execute(QUERY).fetchall()
        assert con.execute(f"select count(*) from {SCHEMA}.empty_table").fetchone() == (0,)
    assert embedded == parquet
    assert [r[2] for r in parquet] == [3] * 4 and [r[3] for r in parquet] == [6] * 4


def test_replacing_a_partition_neither_loses_nor_duplicates_rows(tmp_path):
    root = str(tmp_path / "parquet")
    io_manager = store_io_manager(path=str(tmp_path / "x.duckdb"), store="parquet", root=root)
    _materialize_all(io_manager, n=3)
    key = dg.MultiPartitionKey({"family": "a", "depth": "d2"})
    assert dg.materialize([cells], partition_key=key, resources={"io_manager": io_manager},
                          run_config={"ops": {"cells": {"config": {"n": 5}}}}).success
    with connect_store("parquet", root=root) as con:
        got = con.execute(f"select family, depth, count(*) from {SCHEMA}.cells group by all order by all").fetchall()
    assert got == [("a", "d1", 3), ("a", "d2", 5), ("b", "d1", 3), ("b", "d2", 3)]
    assert not [p for p in (tmp_path / "parquet").rglob("*") if p.name.endswith(".tmp")]  # no temp file left


def test_rows_outside_the_partition_fail_the_write_and_keep_the_old_rows(tmp_path):
    root = str(tmp_path / "parquet")
    io_manager = store_io_manager(path=str(tmp_path / "x.duckdb"), store="parquet", root=root)
    _materialize_all(io_manager)
    result = dg.materialize([cells], partition_key=dg.MultiPartitionKey({"family": "a", "depth": "d1"}),
                            resources={"io_manager": io_manager}, raise_on_error=False,
                            run_config={"ops": {"cells": {"config": {"stray": True}}}})
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "outside the partition" in failure.event_specific_data.error.to_string()
    with connect_store("parquet", root=root) as con:
        assert con.execute(f"select count(*) from {SCHEMA}.cells where family = 'a' and depth = 'd1'").fetchone() == (3,)


def test_a_write_that_fails_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = partition_file(tmp_path, SCHEMA, "t", [("family", "a")])
    write_parquet_atomically(pd.DataFrame({"family": ["a"], "x": [1]}), path)

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_parquet_atomically(pd.DataFrame({"family": ["a", "a"], "x": [2, 3]}), path)
    monkeypatch.undo()
    assert pd.read_parquet(path)["x"].tolist() == [1]
    assert [p.name for p in path.parent.iterdir()] == ["data.parquet"]


def test_the_store_is_chosen_by_environment_or_resource_config(monkeypatch, tmp_path):
    monkeypatch.delenv(STORE_ENV, raising=False)
    assert store_io_manager().store == "duckdb"  # the embedded file stays the default
    monkeypatch.setenv(STORE_ENV, "parquet")
    assert store_io_manager().store == "parquet"
    monkeypatch.setenv(STORE_ENV, "sqlite")
    with pytest.raises(ValueError, match="FEAR_ASSETS_STORE"):
        store_io_manager()
    bad = StoreIOManager(database=str(tmp_path / "x.duckdb"), schema=SCHEMA, store="sqlite")
    with pytest.raises(ValueError, match="store='sqlite'"):
        bad.create_io_manager(None)


# --- per-family partition sets (only the in-design combinations, keys "<depth>|<family>") ---
# Family "a" registers two depths, family "b" one: the partitions hold exactly those three.
from fear_assets.defs.partitions import FAMILY_DEPTH_EXPR, Layout, build_partitions, partition_key  # noqa: E402

DESIGN = build_partitions(Layout(families=("a", "b"), depths=(("a", ("d1", "d2")), ("b", ("d1",))),
                                 batches=(("a", ("s.b000",)), ("b", ("s.b000",)))))


@dg.asset(name="cells", partitions_def=DESIGN.family_depth, metadata=FAMILY_DEPTH_EXPR)
def design_cells(context: dg.AssetExecutionContext, config: Rows) -> pd.DataFrame:
    depth, family = context.partition_key.split("|")
    return pd.DataFrame({"family": family, "depth": depth, "x": range(config.n)})


@dg.asset(name="per_family", partitions_def=DESIGN.family, metadata={"partition_expr": "family"},
          ins={"cells": dg.AssetIn(partition_mapping=DESIGN.all_depths_of_family)})
def design_per_family(context: dg.AssetExecutionContext, cells: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"family": [context.partition_key], "rows": [len(cells)],
                         "families": [",".join(sorted(set(cells["family"])))],
                         "depths": [",".join(sorted(set(cells["depth"])))]})


def _materialize_design(io_manager, n: int = 3, keys=("d1|a", "d2|a", "d1|b")) -> None:
    for key in keys:
        assert dg.materialize([design_cells], partition_key=key, resources={"io_manager": io_manager},
                              run_config={"ops": {"cells": {"config": {"n": n}}}}).success


@pytest.mark.parametrize("store", ["duckdb", "parquet"])
def test_a_per_family_asset_reads_all_depths_of_its_family_and_only_them(tmp_path, store):
    """Through the IO manager on either store: two families' depth partitions written, one
    family's input loads exactly that family's registered depths."""
    assert DESIGN.family_depth.get_partition_keys() == ["d1|a", "d2|a", "d1|b"]
    io_manager = store_io_manager(path=str(tmp_path / "x.duckdb"), store=store, root=str(tmp_path / "parquet"))
    _materialize_design(io_manager)
    for family in "ab":
        assert dg.materialize([design_cells, design_per_family], selection=[design_per_family],
                              partition_key=family, resources={"io_manager": io_manager}).success
    with connect_store(store, path=str(tmp_path / "x.duckdb"), root=str(tmp_path / "parquet")) as con:
        got = con.execute(f"select family, rows, families, depths from {SCHEMA}.per_family order by family").fetchall()
        cells_columns = [r[0] for r in con.execute(f"describe {SCHEMA}.cells").fetchall()]
    assert got == [("a", 6, "a", "d1,d2"), ("b", 3, "b", "d1")]
    assert cells_columns == ["family", "depth", "x"]  # the stored table keeps its columns
    if store == "parquet":  # one file per partition, hive-style per column, as before
        files = sorted(str(p.relative_to(tmp_path / "parquet" / SCHEMA / "cells"))
                       for p in (tmp_path / "parquet" / SCHEMA / "cells").rglob("*.parquet"))
        assert files == ["depth=d1/family=a/data.parquet", "depth=d1/family=b/data.parquet",
                         "depth=d2/family=a/data.parquet"]


@pytest.mark.parametrize("store", ["duckdb", "parquet"])
def test_a_depth_partition_is_replaced_alone_on_either_store(tmp_path, store):
    """A rewritten partition replaces exactly its rows: the others neither lost nor duplicated."""
    io_manager = store_io_manager(path=str(tmp_path / "x.duckdb"), store=store, root=str(tmp_path / "parquet"))
    _materialize_design(io_manager, n=3)
    _materialize_design(io_manager, n=5, keys=(partition_key("a", "d2"),))
    with connect_store(store, path=str(tmp_path / "x.duckdb"), root=str(tmp_path / "parquet")) as con:
        got = con.execute(f"select family, depth, count(*) from {SCHEMA}.cells group by all order by all").fetchall()
    assert got == [("a", "d1", 3), ("a", "d2", 5), ("b", "d1", 3)]


def test_a_family_asset_reads_its_own_batches_only():
    """The family x batch mappings: a family's summary depends on its own batches, a batch on its family."""
    sub = DESIGN.family.subset_with_partition_keys(["b"])
    up = DESIGN.all_batches_of_family.get_upstream_mapped_partitions_result_for_partitions(
        sub, DESIGN.family, DESIGN.family_batch)
    assert set(up.partitions_subset.get_partition_keys()) == {"s.b000|b"}
    batch = DESIGN.family_batch.subset_with_partition_keys(["s.b000|a"])
    up = DESIGN.family_of_batch.get_upstream_mapped_partitions_result_for_partitions(
        batch, DESIGN.family_batch, DESIGN.family)
    assert set(up.partitions_subset.get_partition_keys()) == {"a"}
