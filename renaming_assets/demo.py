"""``bash scripts/fear renaming``: build, audit and freeze the registered bundle, answer it
with the SYNTHETIC responder, and run the analyzer, printing the primary endpoints.

The synthetic log is a demonstration of the pipeline, not evidence; the printed result's
first line says so. Standard library only (no install needed beyond Python 3.11).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from renaming_assets import analyze, bundle
from renaming_assets.synthetic import write_synthetic_log

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bash scripts/fear renaming", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "data" / "renaming",
                        help="directory for bundle/, synthetic_log.jsonl and result.json (default data/renaming)")
    args = parser.parse_args(argv)
    out = args.out
    t = time.perf_counter()
    code = bundle.main([str(out / "bundle")])
    if code:
        return code
    log = write_synthetic_log(out / "bundle" / bundle.PLAN, out / "synthetic_log.jsonl")
    print(f"renaming demo: SYNTHETIC responder wrote {log}")
    code = analyze.main([str(out / "bundle"), str(log), "--out", str(out / "result.json")])
    print(f"renaming demo: result {out / 'result.json'} ({time.perf_counter() - t:.0f} s in all)")
    return code


if __name__ == "__main__":
    sys.exit(main())
