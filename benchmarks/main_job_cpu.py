"""Per-step CPU seconds of the main job (``python -m fear_assets.defs.main``).

On a shared machine wall-clock time says little; the CPU seconds a step spends (this
process, its threads, and its child processes: joblib workers, compilers) depend far less
on the load. This wraps ``dagster.materialize`` (each step of the main job is one call),
runs the main job, and writes one row per step: wall seconds, CPU seconds, and the load
average at the step's end. Run torch with one thread (``OMP_NUM_THREADS=1``): with two
intra-op threads on a loaded machine the waiting thread spins and its CPU seconds inflate
(measured: the d1 scores step took 319 CPU s at load 10 with two threads; the same
documents scored with one thread, 106 CPU s). A quiet 2-core wall time is then projected per step from its CPU seconds and its
parallelism (README: the main job's time).

    OMP_NUM_THREADS=1 FEAR_ASSETS_DUCKDB=/tmp/x.duckdb PYTHONPATH=$PWD DAGSTER_HOME=$PWD \\
        nice -n 10 python benchmarks/main_job_cpu.py --out benchmarks/results/main_job_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process, its reaped children and its live descendants."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:  # ended between listing and reading: its time is in children_*
            continue
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the per-step figures")
    parser.add_argument("duckdb", nargs="?", default=None, help="DuckDB file (default: $FEAR_ASSETS_DUCKDB)")
    args = parser.parse_args()

    import dagster as dg

    steps: list[dict] = []
    original = dg.materialize

    def timed_materialize(*a, **kw):
        selection = kw.get("selection")
        key = kw.get("partition_key")
        w, c = time.perf_counter(), tree_cpu_seconds()
        try:
            return original(*a, **kw)
        finally:
            steps.append({"selection": list(selection or []), "partition": str(key) if key is not None else None,
                          "wall_s": round(time.perf_counter() - w, 2), "cpu_s": round(tree_cpu_seconds() - c, 2),
                          "load1": round(os.getloadavg()[0], 2)})
            args.out.write_text(json.dumps({"steps": steps}, indent=1))

    dg.materialize = timed_materialize
    from fear_assets.defs import main as main_job

    w0, c0 = time.perf_counter(), tree_cpu_seconds()
    rc = main_job.run(args.duckdb)
    total = {"wall_s": round(time.perf_counter() - w0, 1), "cpu_s": round(tree_cpu_seconds() - c0, 1),
             "steps_cpu_s": round(sum(s["cpu_s"] for s in steps), 1), "load1_end": round(os.getloadavg()[0], 2),
             "cores": os.cpu_count(), "rc": rc}
    args.out.write_text(json.dumps({"total": total, "steps": steps}, indent=1))
    print(json.dumps(total))
    for s in sorted(steps, key=lambda s: -s["cpu_s"])[:20]:
        print(f"{s['cpu_s']:8.1f} cpu s {s['wall_s']:8.1f} wall s  {','.join(s['selection'])} {s['partition']}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
