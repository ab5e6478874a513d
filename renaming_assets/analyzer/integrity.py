"""Hard integrity checks (protocol, "Integrity, missingness and endpoint validity").

"The analyzer first verifies the frozen source and artifact hashes, then requires exactly
one attempted row per planned name across the provided logs. Requests, expected labels and
metadata must match the frozen job in ordered JSON, and the request-body hash must agree.
Duplicates, unplanned jobs, missing attempts, reordered candidates and mixed
synthetic/real evidence cause a hard failure." Each failure raises :class:`IntegrityError`
with one message naming the job (or the file) and what to do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from renaming_assets.bundle import ARTIFACTS, AUDIT, FREEZE, PLAN, sha256_file, source_hashes


class IntegrityError(Exception):
    """A hard failure: the analysis stops with exit status 2."""


def _sha256_canonical(obj: object) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ordered_equal(a: object, b: object) -> bool:
    """Equality of JSON values that also requires the same key order in every object."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(ordered_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(ordered_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def verify_freeze(bundle: Path) -> dict:
    """Frozen source hashes (this package's files) and artifact hashes; a passed audit."""
    path = bundle / FREEZE
    if not path.is_file():
        raise IntegrityError(f"{path}: missing; build the bundle with `python -m renaming_assets.bundle {bundle}`")
    freeze = json.loads(path.read_text(encoding="utf-8"))
    current = source_hashes()
    for name, digest in freeze.get("sources", {}).items():
        if current.get(name) != digest:
            raise IntegrityError(f"{path}: frozen source {name} differs from this package's file; analyze with the "
                                 f"frozen code or record a new manifest before execution")
    extra = sorted(set(current) - set(freeze.get("sources", {})))
    if extra:
        raise IntegrityError(f"{path}: source {extra[0]} is not in the frozen manifest; record a new manifest")
    for name in ARTIFACTS:
        recorded = freeze.get("artifacts", {}).get(name)
        if recorded is None or not (bundle / name).is_file() or sha256_file(bundle / name) != recorded:
            raise IntegrityError(f"{bundle / name}: artifact hash does not match {path}; the bundle was changed "
                                 f"after freezing")
    audit = json.loads((bundle / AUDIT).read_text(encoding="utf-8"))
    if audit.get("passed") is not True:
        raise IntegrityError(f"{bundle / AUDIT}: the frozen audit did not pass")
    return freeze


def load_plan(bundle: Path) -> dict[str, dict]:
    """job -> planned row, in dispatch order."""
    plan: dict[str, dict] = {}
    with open(bundle / PLAN, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            plan[row["job"]] = row
    return plan


def _where(path: Path, line: int) -> str:
    return f"{path} line {line}"


def collect_attempts(plan: dict[str, dict], logs: list[Path]) -> dict[str, dict]:
    """Exactly one attempted row per planned job across ``logs``, each matching its frozen
    job; returns job -> log row (with ``_where``)."""
    rows: dict[str, dict] = {}
    first_kind: tuple[bool, str, str] | None = None
    for path in logs:
        if not Path(path).is_file():
            raise IntegrityError(f"{path}: log file not found")
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = _where(path, number)
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise IntegrityError(f"{where}: not a JSON object ({error.msg}); logs are JSON lines") from None
                if not isinstance(row, dict) or not isinstance(row.get("job"), str):
                    raise IntegrityError(f"{where}: row has no string field 'job'")
                job = row["job"]
                frozen = plan.get(job)
                if frozen is None:
                    raise IntegrityError(f"unplanned job {job!r} ({where}): not in the frozen plan")
                if job in rows:
                    raise IntegrityError(f"duplicate attempt for job {job!r}: {rows[job]['_where']} and {where}; "
                                         f"exactly one attempted row per planned job is allowed")
                synthetic = row.get("synthetic")
                if not isinstance(synthetic, bool):
                    raise IntegrityError(f"job {job!r} ({where}): field 'synthetic' must be true or false")
                if first_kind is None:
                    first_kind = (synthetic, job, where)
                elif synthetic != first_kind[0]:
                    raise IntegrityError(
                        f"mixed synthetic/real evidence: job {job!r} ({where}) has synthetic={str(synthetic).lower()} "
                        f"but job {first_kind[1]!r} ({first_kind[2]}) has synthetic={str(first_kind[0]).lower()}")
                _match(job, row, frozen, where)
                # Keep what the analysis reads; the verified body is the frozen one.
                rows[job] = {k: row.get(k) for k in ("synthetic", "started_at", "duration_s", "response")}
                rows[job]["_where"] = where
    missing = [job for job in plan if job not in rows]
    if missing:
        raise IntegrityError(f"missing attempt for planned job {missing[0]!r} ({len(missing)} planned jobs have no "
                             f"row); finish only untouched jobs under the original plan or declare the study "
                             f"incomplete")
    return rows


def _match(job: str, row: dict, frozen: dict, where: str) -> None:
    body, planned = row.get("body"), frozen["body"]
    if isinstance(body, dict) and isinstance(body.get("alternatives"), list):
        alternatives, planned_alternatives = body["alternatives"], planned["alternatives"]
        if not ordered_equal(alternatives, planned_alternatives) and len(alternatives) == len(planned_alternatives) \
                and sorted(map(_sha256_canonical, alternatives)) == sorted(map(_sha256_canonical, planned_alternatives)):
            raise IntegrityError(f"reordered candidates in job {job!r} ({where}): alternatives are not in the frozen "
                                 f"order")
    expected = row.get("expected")
    if isinstance(expected, dict) and isinstance(expected.get("keys"), list) and \
            expected["keys"] != frozen["expected"]["keys"] and \
            sorted(map(str, expected["keys"])) == sorted(frozen["expected"]["keys"]):
        raise IntegrityError(f"reordered candidates in job {job!r} ({where}): expected keys are not in the frozen "
                             f"order")
    if not ordered_equal(body, planned):
        raise IntegrityError(f"request body of job {job!r} ({where}) differs from the frozen body (ordered JSON)")
    if row.get("body_sha256") != frozen["body_sha256"] or _sha256_canonical(body) != frozen["body_sha256"]:
        raise IntegrityError(f"body_sha256 of job {job!r} ({where}) does not agree with the frozen body hash")
    if not ordered_equal(expected, frozen["expected"]):
        raise IntegrityError(f"expected labels of job {job!r} ({where}) differ from the frozen job (ordered JSON)")
    if not ordered_equal(row.get("metadata"), frozen["metadata"]):
        raise IntegrityError(f"metadata of job {job!r} ({where}) differs from the frozen job (ordered JSON)")
