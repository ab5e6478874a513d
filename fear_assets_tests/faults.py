"""The fault-injection suite's ledger (issue 16): every fault test records what it injected,
how many times, whether the system survived (no traceback, a named error, the right rows),
and how many rows were lost or duplicated.

``FEAR_FAULTS_REPORT=benchmarks/results/faults.json python -m pytest -m faults -n 0`` writes
the ledger as JSON at the end of the session; ``python -m fear_assets_tests.faults
benchmarks/results/faults.json`` prints README's table from it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPORT_ENV = "FEAR_FAULTS_REPORT"


@dataclass
class FaultRecord:
    fault: str
    injected: int
    survived: int
    rows_lost: int = 0
    rows_duplicated: int = 0
    test: str = ""


LEDGER: list[FaultRecord] = []


def record(fault: str, injected: int, survived: int, rows_lost: int = 0, rows_duplicated: int = 0,
           test: str = "") -> FaultRecord:
    """Add one line to the ledger (the test asserts survived == injected and zero rows lost itself)."""
    entry = FaultRecord(fault, int(injected), int(survived), int(rows_lost), int(rows_duplicated),
                        test or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0])
    LEDGER.append(entry)
    return entry


def summary(ledger: list[FaultRecord]) -> dict:
    faults: dict[str, dict] = {}
    for e in ledger:
        f = faults.setdefault(e.fault, {"fault": e.fault, "injected": 0, "survived": 0, "rows_lost": 0,
                                        "rows_duplicated": 0, "tests": []})
        for k in ("injected", "survived", "rows_lost", "rows_duplicated"):
            f[k] += getattr(e, k)
        if e.test and e.test not in f["tests"]:
            f["tests"].append(e.test)
    total = {k: sum(f[k] for f in faults.values()) for k in ("injected", "survived", "rows_lost", "rows_duplicated")}
    return {"faults": list(faults.values()), "total": total, "records": [asdict(e) for e in ledger],
            "command": "FEAR_FAULTS_REPORT=benchmarks/results/faults.json python -m pytest -m faults -n 0",
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def write_report(path: str | Path, ledger: list[FaultRecord]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary(ledger), indent=2) + "\n", encoding="utf-8")
    return path


def markdown(report: dict) -> str:
    lines = ["| fault injected | injected | survived | rows lost | rows duplicated |", "|---|---:|---:|---:|---:|"]
    for f in report["faults"]:
        lines.append(f"| {f['fault']} | {f['injected']} | {f['survived']} | {f['rows_lost']} | {f['rows_duplicated']} |")
    t = report["total"]
    lines.append(f"| **all** | **{t['injected']}** | **{t['survived']}** | **{t['rows_lost']}** | "
                 f"**{t['rows_duplicated']}** |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/faults.json").read_text())))
