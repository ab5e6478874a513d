"""Write fear_assets_tests/durations.json (seconds per test module) from a pytest log run with
``--durations=0``: the suite then starts its longest modules first (fear_assets_tests/conftest.py).

    .venv/bin/python -m pytest -n 2 --dist loadfile --durations=0 | tee suite.log
    .venv/bin/python scripts/test_durations.py suite.log
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"\s*([0-9.]+)s (?:call|setup|teardown)\s+([^:\s]+\.py)::")


def module_seconds(log: str) -> dict[str, float]:
    sums: collections.Counter = collections.Counter()
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            sums[m.group(2)] += float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = module_seconds(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    if not seconds:
        print(f"{argv[0]}: no duration lines (run pytest with --durations=0)", file=sys.stderr)
        return 1
    target = Path(__file__).resolve().parents[1] / "fear_assets_tests" / "durations.json"
    target.write_text(json.dumps(seconds, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target} ({len(seconds)} modules, {sum(seconds.values()):.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
