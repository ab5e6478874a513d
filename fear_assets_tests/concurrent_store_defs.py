"""A small code location for the concurrent-writer test (fear_assets_tests/test_store_concurrency.py).

One partitioned asset in pool "duckdb", stored by the project's own IO manager
(``store_io_manager``): the backfill's run config picks the store (``store: duckdb`` or
``store: parquet``), exactly as a deployment would. Each partition is a table slice of
``rows`` rows tagged with a ``generation``, so a replaced partition that lost or duplicated
rows shows up in the counts. ``barrier_size`` > 1 makes the steps of a wave wait for each
other before returning, so their writes really are in flight at the same moment.
"""

import os
import time
from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.defs.resources.store import store_io_manager

PARTITIONS = [f"p{i:02d}" for i in range(int(os.environ.get("FEAR_TEST_PARTITIONS", "4")))]
partitions = dg.StaticPartitionsDefinition(PARTITIONS)


def partition_frame(part: str, generation: int, rows: int) -> pd.DataFrame:
    """The rows a partition holds at a generation (deterministic: no random draw)."""
    i = pd.RangeIndex(rows)
    return pd.DataFrame({"part": part, "generation": generation, "row_id": i.to_numpy(),
                         "value": (i.to_numpy() * 0.5 + generation), "label": [f"{part}-{k}" for k in i]})


class LoadConfig(dg.Config):
    generation: int = 1
    rows: int = 20_000
    barrier_dir: str = ""
    barrier_size: int = 1
    barrier_timeout_s: float = 90.0
    #: Seconds a step holds its pool slot before it returns: with one slot, a run that arrives
    #: meanwhile waits in its own process, so the queue's runs are visibly in flight together.
    hold_s: float = 0.0


def _wait_for_wave(part: str, cfg: LoadConfig, log) -> None:
    d = Path(cfg.barrier_dir)
    (d / part).touch()
    arrived = sorted(p.name for p in d.iterdir())
    wave = arrived.index(part) // cfg.barrier_size if part in arrived else 0
    need = min((wave + 1) * cfg.barrier_size, len(PARTITIONS))
    deadline = time.monotonic() + cfg.barrier_timeout_s
    while sum(1 for _ in d.iterdir()) < need:
        if time.monotonic() > deadline:
            raise dg.Failure(f"barrier: only {sum(1 for _ in d.iterdir())} of {need} writers arrived")
        time.sleep(0.05)
    log.info(f"WRITE_BEGIN {part}")


@dg.asset(partitions_def=partitions, metadata={"partition_expr": "part"}, pool="duckdb")
def store_load(context: dg.AssetExecutionContext, config: LoadConfig) -> pd.DataFrame:
    frame = partition_frame(context.partition_key, config.generation, config.rows)
    if config.barrier_size > 1:
        _wait_for_wave(context.partition_key, config, context.log)
    else:
        time.sleep(config.hold_s)
        context.log.info(f"WRITE_BEGIN {context.partition_key}")
    return frame


# In-process: each run executes its one step in the run worker itself, instead of starting a
# second interpreter per run (multiprocess executor) that imports dagster and pandas again.
# Pools are claimed the same way (the in-process executor holds the instance's concurrency
# context), and each run is still its own process, so the writes stay concurrent.
defs = dg.Definitions(assets=[store_load], resources={"io_manager": store_io_manager()},
                      executor=dg.in_process_executor)
