"""Topic frequency, the covariate of the five-fear breakdown of H2 (protocol 5).

The protocol's covariate is the exact-match count of each threat verb phrase in the Dolma
v1.7 corpus. Those counts need the corpus (terabytes) or an index service, neither of
which this pipeline can reach offline, so they are never computed here and never
invented: a researcher supplies them as a CSV (``phrase,count``), and until then the
breakdown runs without the covariate and says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import pandas as pd

from fear_assets.core.errors import InputError

COLUMNS = ("phrase", "count")
_COUNT = re.compile(r"^[0-9]+$")


def not_supplied_message(path: Path) -> str:
    return (f"Topic-frequency counts were not supplied: {path} does not exist. The covariate is the exact-match "
            "count of each threat verb phrase in the Dolma v1.7 corpus, which cannot be computed offline, so the "
            "five-fear breakdown of H2 is reported without it. To add it, count each phrase in Dolma v1.7 (e.g. "
            f"with an n-gram index such as infini-gram) and write a CSV with header 'phrase,count' to {path}, one "
            "row per threat verb phrase.")


def load_topic_counts(path: Path, required_phrases: Sequence[str]) -> tuple[pd.DataFrame | None, str]:
    """(counts, message). Absent file: (None, why and where to put it). Present file: every
    row validated (whole non-negative counts, no duplicate phrase, every required phrase
    present); an error names the file, the row (its line in the file), the field and the
    fix. Extra phrases are kept; the caller joins on the ones it needs."""
    path = Path(path)
    if not path.exists():
        return None, not_supplied_message(path)
    if not path.is_file():
        raise InputError(path, "file", "path", "is not a regular file", "point to the CSV file itself")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise InputError(path, "file", "header", "the file is empty",
                         "write the header 'phrase,count' and one row per phrase") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(path, "file", "format", f"not a readable UTF-8 CSV ({exc})",
                         "save it as a comma-separated UTF-8 file with header 'phrase,count'") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in COLUMNS if c not in raw.columns]
    if missing:
        raise InputError(path, "header", ",".join(missing), f"column(s) {missing} missing (found {list(raw.columns)})",
                         "make the first line exactly 'phrase,count'")
    seen: dict[str, int] = {}
    rows = []
    for i, (phrase, count) in enumerate(zip(raw["phrase"], raw["count"])):
        line = i + 2  # the header is line 1
        item = f"row {line}"
        phrase, count = str(phrase).strip(), str(count).strip()
        if not phrase:
            raise InputError(path, item, "phrase", "is empty", "write the threat verb phrase as it appears in the bank")
        if not _COUNT.match(count):
            raise InputError(path, item, "count", f"{count!r} is not a non-negative whole number",
                             "write the exact-match count as digits only (no sign, decimals or separators)")
        if phrase in seen:
            raise InputError(path, item, "phrase", f"{phrase!r} repeats row {seen[phrase]}",
                             "keep one row per phrase (sum the counts if they came from several shards)")
        seen[phrase] = line
        rows.append((phrase, int(count)))
    absent = [p for p in required_phrases if p not in seen]
    if absent:
        raise InputError(path, "phrase list", "phrase", f"{len(absent)} required phrase(s) missing: {absent}",
                         "add one row per missing phrase with its Dolma v1.7 exact-match count")
    counts = pd.DataFrame(rows, columns=list(COLUMNS)).astype({"count": "int64"})
    return counts, f"Topic-frequency counts loaded from {path}: {len(counts)} phrase(s), all required present."
