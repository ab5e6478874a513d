"""The analyzer: ``python -m renaming_assets.analyze BUNDLE LOG [LOG ...] --out result.json``.

Verifies the frozen hashes, requires exactly one matching attempted row per planned job,
judges label and vector validity, and computes every registered figure into
``result.json`` (first line: whether the evidence is synthetic). Hard failures exit with
status 2 and one message naming the job. No retries, no replacement. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from renaming_assets.analyzer.estimands import analyze_outcomes
from renaming_assets.analyzer.integrity import IntegrityError, collect_attempts, load_plan, verify_freeze
from renaming_assets.analyzer.validity import outcome
from renaming_assets.bundle import FREEZE, sha256_file
from renaming_assets.settings import LAYOUTS, NAMINGS, SETTINGS, TASKS, Settings

SYNTHETIC_EVIDENCE = ("SYNTHETIC EVIDENCE: every row comes from the synthetic test/demo responder "
                      "(synthetic: true); these figures are not model outcomes")
REAL_EVIDENCE = "real service responses (synthetic: false)"


def analyze(bundle: Path, logs: list[Path], settings: Settings = SETTINGS) -> dict:
    bundle = Path(bundle)
    t = time.perf_counter()
    verify_freeze(bundle)
    plan = load_plan(bundle)
    rows = collect_attempts(plan, [Path(p) for p in logs])
    synthetic = next(iter(rows.values()))["synthetic"]
    outcomes = {job: outcome(job, rows[job], plan[job], settings) for job in plan}
    result = {
        "evidence": SYNTHETIC_EVIDENCE if synthetic else REAL_EVIDENCE,
        "synthetic": synthetic,
        "study": settings.study,
        "freeze_sha256": sha256_file(bundle / FREEZE),
        "logs": [str(p) for p in logs],
        "attempted_rows": len(rows),
        "planned_jobs": len(plan),
        # A reduced test/demo bundle is not the registered cohort.
        "registered_cohort": len(plan) == SETTINGS.cohort.worlds * len(LAYOUTS) * len(TASKS) * len(NAMINGS)
        * len(SETTINGS.schedule.copies),
        "validity": {
            "valid_labels": sum(o.label is not None for o in outcomes.values()),
            "failure_categories": dict(sorted(Counter(o.failure for o in outcomes.values() if o.failure).items())),
            "failed_jobs": sorted(o.job for o in outcomes.values() if o.failure),
            "complete_vectors": sum(o.vector is not None for o in outcomes.values()),
            "valid_confidence": sum(o.confidence_valid for o in outcomes.values()),
            "valid_usage": sum(o.usage_valid for o in outcomes.values()),
            "rows_with_start_and_duration": sum(o.timed for o in outcomes.values()),
            "argmax_mismatch_jobs": sorted(o.job for o in outcomes.values() if o.argmax_flag),
        },
        **analyze_outcomes(plan, outcomes, settings),
    }
    result["seconds"] = time.perf_counter() - t
    return result


def dumps_result(result: dict) -> str:
    """JSON whose first line carries the evidence statement."""
    text = json.dumps(result, indent=1, ensure_ascii=True)
    if not text.startswith('{\n "evidence"'):
        raise ValueError("result must start with its 'evidence' statement")
    return "{" + text[len("{\n "):] + "\n"


def endpoint_lines(result: dict) -> list[str]:
    lines = [result["evidence"]]
    for e in result["primary"]["endpoints"]:
        if e["estimate"] is None:
            lines.append(f"{e['endpoint']}: unavailable (a family has no complete worlds)")
            continue
        lo, hi = e["interval_95"]
        lines.append(f"{e['endpoint']}: excess {e['estimate']:+.4f} [95% {lo:+.4f}, {hi:+.4f}] "
                     f"p_sign_flip {e['p_sign_flip']:.4g} p_holm {e['p_holm']:.4g} "
                     f"complete worlds {sum(e['complete_worlds'].values())}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m renaming_assets.analyze", description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("logs", type=Path, nargs="+", metavar="LOG")
    parser.add_argument("--out", type=Path, required=True, help="result.json to write")
    args = parser.parse_args(argv)
    try:
        result = analyze(args.bundle, args.logs)
    except IntegrityError as error:
        print(f"renaming analyze: {error}", file=sys.stderr)
        return 2
    args.out.write_text(dumps_result(result), encoding="utf-8")
    print("\n".join(endpoint_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
