"""The release bundle: ``python -m renaming_assets.bundle OUTDIR``.

Writes ``plan.jsonl`` (one planned job per line, in dispatch order), ``audit.json`` (the
independent auditor's report), ``precision.json`` (planning) and ``freeze.json`` (SHA-256
of the hashed source files and of every artifact). Protocol: "freeze.json records the
final prepared bytes; any review-driven change must receive a new manifest before
execution." Two runs give byte-identical bundles (no timestamps, fixed key order).
The bundle is not frozen when the audit fails. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from renaming_assets.auditor import audit_plan
from renaming_assets.generator import generate_plan
from renaming_assets.precision import precision_plan
from renaming_assets.settings import SETTINGS, Settings

PACKAGE_DIR = Path(__file__).resolve().parent
PLAN, AUDIT, PRECISION, FREEZE = "plan.jsonl", "audit.json", "precision.json", "freeze.json"
ARTIFACTS = (PLAN, AUDIT, PRECISION)
#: The frozen sources: the protocol text and every standard-library module of the study.
#: Dagster wiring (assets.py, definitions.py) and the synthetic responder are not frozen.
SOURCE_GLOBS = ("PROTOCOL.txt", "__init__.py", "settings.py", "precision.py", "bundle.py", "analyze.py",
                "generator/*.py", "auditor/*.py", "analyzer/*.py")


class AuditFailed(RuntimeError):
    """The auditor reported failures; the bundle is left unfrozen."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    files = {p for pattern in SOURCE_GLOBS for p in package_dir.glob(pattern)}
    return sorted(files, key=lambda p: p.relative_to(package_dir).as_posix())


def source_hashes(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    return {p.relative_to(package_dir).as_posix(): sha256_file(p) for p in source_files(package_dir)}


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


def write_plan(outdir: Path, rows: list[dict]) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / PLAN
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":"), ensure_ascii=True))
            f.write("\n")
    return path


def read_plan(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_audit(outdir: Path, audit: dict) -> Path:
    write_json(outdir / AUDIT, audit)
    if not audit["passed"]:
        raise AuditFailed(f"{outdir / AUDIT}: the audit found {audit['failure_count']} failures, "
                          f"first: {audit['failures'][0]}; the bundle is not frozen")
    return outdir / AUDIT


def write_precision(outdir: Path, settings: Settings) -> Path:
    write_json(outdir / PRECISION, precision_plan(settings))
    return outdir / PRECISION


def freeze_record(outdir: Path, settings: Settings) -> dict:
    return {
        "study": settings.study,
        "status": "prepared offline; no requests have been sent and no model outcomes exist",
        "sources": source_hashes(),
        "artifacts": {name: sha256_file(outdir / name) for name in ARTIFACTS},
    }


def write_freeze(outdir: Path, settings: Settings) -> Path:
    write_json(outdir / FREEZE, freeze_record(outdir, settings))
    return outdir / FREEZE


def build_bundle(outdir: Path, settings: Settings = SETTINGS) -> dict[str, float]:
    """Generate, audit, plan precision and freeze; returns seconds per stage."""
    outdir = Path(outdir)
    seconds = {}
    t = time.perf_counter()
    rows = generate_plan(settings)
    write_plan(outdir, rows)
    seconds["generate"] = time.perf_counter() - t
    t = time.perf_counter()
    write_audit(outdir, audit_plan(rows, settings))
    seconds["audit"] = time.perf_counter() - t
    t = time.perf_counter()
    write_precision(outdir, settings)
    write_freeze(outdir, settings)
    seconds["freeze"] = time.perf_counter() - t
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m renaming_assets.bundle", description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path, help="directory to write the bundle into (created if missing)")
    args = parser.parse_args(argv)
    try:
        seconds = build_bundle(args.outdir)
    except AuditFailed as error:
        print(f"renaming bundle: {error}", file=sys.stderr)
        return 1
    print(f"renaming bundle: wrote {args.outdir} ("
          + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
