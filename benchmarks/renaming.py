"""Renaming study performance: full bundle (generate + audit + freeze) and the analyzer.

Budgets (issue 13): the registered bundle in under 2 minutes on 2 cores; the analyzer over
13,824 log rows with 10,000 bootstrap and 10,000 sign-flip draws in under 1 minute. Both
stages run one after the other in this process, each timed by wall clock and by this
process's CPU time (on a shared machine the CPU time is the quiet-machine estimate; the
load average is recorded before and after). Writes ``benchmarks/results/renaming.json``.

    nice -n 10 .venv/bin/python benchmarks/renaming.py
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from renaming_assets.analyze import analyze  # noqa: E402
from renaming_assets.bundle import PLAN, build_bundle  # noqa: E402
from renaming_assets.settings import SETTINGS  # noqa: E402
from renaming_assets.synthetic import write_synthetic_log  # noqa: E402

BUNDLE_BUDGET_S, ANALYZER_BUDGET_S = 120.0, 60.0


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="renaming-bench-"))
    try:
        load_before = os.getloadavg()
        stages, bundle_wall, bundle_cpu = _timed(lambda: build_bundle(work / "bundle", SETTINGS))
        log = write_synthetic_log(work / "bundle" / PLAN, work / "log.jsonl")
        result, analyze_wall, analyze_cpu = _timed(lambda: analyze(work / "bundle", [log], SETTINGS))
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {
        "command": "nice -n 10 .venv/bin/python benchmarks/renaming.py",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"logical_cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "niceness": os.nice(0)},
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in load_after]},
        "bundle": {"wall_s": round(bundle_wall, 2), "cpu_s": round(bundle_cpu, 2),
                   "stages_wall_s": {k: round(v, 2) for k, v in stages.items()},
                   "budget_s": BUNDLE_BUDGET_S, "wall_over_budget": round(bundle_wall / BUNDLE_BUDGET_S, 3),
                   "jobs": result["attempted_rows"]},
        "analyzer": {"wall_s": round(analyze_wall, 2), "cpu_s": round(analyze_cpu, 2),
                     "rows": result["attempted_rows"], "bootstrap_draws": SETTINGS.inference.bootstrap_draws,
                     "sign_flip_draws": SETTINGS.inference.sign_flip_draws, "budget_s": ANALYZER_BUDGET_S,
                     "wall_over_budget": round(analyze_wall / ANALYZER_BUDGET_S, 3)},
    }
    out = ROOT / "benchmarks" / "results" / "renaming.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    b, a = record["bundle"], record["analyzer"]
    print(f"bundle: wall {b['wall_s']} s (cpu {b['cpu_s']} s; {b['stages_wall_s']}) budget {BUNDLE_BUDGET_S:.0f} s")
    print(f"analyzer: wall {a['wall_s']} s (cpu {a['cpu_s']} s) over {a['rows']} rows budget {ANALYZER_BUDGET_S:.0f} s")
    print(f"load average before {record['load_average_1_5_15']['before']} after {record['load_average_1_5_15']['after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
