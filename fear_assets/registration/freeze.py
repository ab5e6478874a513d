"""The freeze record of the registered inputs and the check against it (D6).

``data/registration/frozen_inputs.json`` holds the bank's and the settings' canonical
sha256 together with per-item and per-section hashes. :func:`compare_with_record` names
exactly what changed (which bank item, which settings section), so a failed freeze check
tells the researcher what to restore or to re-register.

Freeze the current inputs with ``python -m fear_assets.registration.freeze``. When the
inputs differ from the committed record, re-freezing needs ``--reason "..."``: the record
keeps a ``changes`` list (date, reason, hashes before and after, what changed), so every
deliberate change to a frozen input is documented where the freeze check reads it (D6, D8).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fear_assets.core.errors import FreezeError
from fear_assets.core.settings import DEFAULT_BANK_DIR, DEFAULT_REGISTRATION_DIR, DEFAULT_SETTINGS_PATH, ProtocolSettings, load_settings
from fear_assets.stimuli.bank import Bank, load_bank

RECORD_NAME = "frozen_inputs.json"


def freeze_record(settings: ProtocolSettings, bank: Bank) -> dict:
    return {
        "protocol": settings.protocol.name,
        "protocol_version": settings.protocol.version,
        "bank_sha256": bank.sha256,
        "settings_sha256": settings.sha256,
        "bank_items": bank.item_hashes(),
        "settings_sections": settings.section_hashes(),
    }


def write_record(record: dict, registration_dir: str | Path = DEFAULT_REGISTRATION_DIR) -> Path:
    """Write atomically (temp file + rename): a crash never leaves half a record."""
    directory = Path(registration_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / RECORD_NAME
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
        json.dump(record, tmp, indent=2, sort_keys=True)
        tmp.write("\n")
    os.replace(tmp.name, target)
    return target


def read_record(registration_dir: str | Path = DEFAULT_REGISTRATION_DIR) -> dict:
    path = Path(registration_dir) / RECORD_NAME
    if not path.is_file():
        raise FreezeError(f"{path} not found: freeze the registered inputs with "
                          "`python -m fear_assets.registration.freeze` and commit the record")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class FreezeComparison:
    passed: bool
    bank_sha256: str
    settings_sha256: str
    frozen_bank_sha256: str
    frozen_settings_sha256: str
    changed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.passed:
            return "bank and settings match the frozen registration record"
        return ("inputs differ from the frozen registration record: " + "; ".join(self.changed) +
                ". Restore the frozen files, or re-register (re-freeze) before any confirmatory run.")


def diff_hashes(kind: str, now: dict[str, str], frozen: dict[str, str]) -> list[str]:
    """Each key of two hash maps that was added, removed or changed, named with ``kind``."""
    out = []
    for key in sorted(set(now) | set(frozen)):
        if key not in frozen:
            out.append(f"{kind} {key} added")
        elif key not in now:
            out.append(f"{kind} {key} removed")
        elif now[key] != frozen[key]:
            out.append(f"{kind} {key} changed")
    return out


def compare_with_record(settings: ProtocolSettings, bank: Bank, record: dict) -> FreezeComparison:
    now = freeze_record(settings, bank)
    changed = diff_hashes("bank", now["bank_items"], record.get("bank_items", {})) + \
        diff_hashes("settings section", now["settings_sections"], record.get("settings_sections", {}))
    passed = now["bank_sha256"] == record.get("bank_sha256") and now["settings_sha256"] == record.get("settings_sha256")
    if not passed and not changed:
        changed = ["canonical hashes differ although no item or section hash does (record edited by hand?)"]
    return FreezeComparison(passed=passed, bank_sha256=now["bank_sha256"], settings_sha256=now["settings_sha256"],
                            frozen_bank_sha256=record.get("bank_sha256", ""),
                            frozen_settings_sha256=record.get("settings_sha256", ""), changed=changed)


def refreeze(settings: ProtocolSettings, bank: Bank, previous: dict | None, reason: str, date: str) -> dict:
    """A new freeze record of the current inputs that carries the previous record's
    ``changes`` and, where the inputs differ from it, one more entry: the date, the written
    reason, the bank and settings hashes before and after, and what changed (D8: a change
    to a registered input is "an explicit edit ... with a written reason", recorded "with
    the hashes before and after and the date"). An unchanged input needs no reason."""
    record = freeze_record(settings, bank)
    changes = list(previous.get("changes", [])) if previous else []
    if previous is not None:
        comparison = compare_with_record(settings, bank, previous)
        if not comparison.passed:
            if not reason.strip():
                raise FreezeError("the bank or settings differ from the frozen record (" + "; ".join(comparison.changed)
                                  + "): give the reason for the change with --reason \"...\"")
            changes.append({
                "date": date, "reason": reason.strip(),
                "bank_sha256_before": previous.get("bank_sha256", ""), "bank_sha256_after": record["bank_sha256"],
                "settings_sha256_before": previous.get("settings_sha256", ""),
                "settings_sha256_after": record["settings_sha256"], "changed": comparison.changed,
            })
    record["changes"] = changes
    return record


def main(argv: list[str] | None = None) -> int:
    import argparse
    import datetime

    parser = argparse.ArgumentParser(prog="python -m fear_assets.registration.freeze",
                                     description="Freeze the bank and settings hashes (D6).")
    parser.add_argument("settings", nargs="?", default=str(DEFAULT_SETTINGS_PATH))
    parser.add_argument("bank", nargs="?", default=str(DEFAULT_BANK_DIR))
    parser.add_argument("registration_dir", nargs="?", default=str(DEFAULT_REGISTRATION_DIR))
    parser.add_argument("--reason", default="", help="why the frozen inputs changed (required when they did)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    settings = load_settings(Path(args.settings))
    bank = load_bank(Path(args.bank), settings)
    previous_path = Path(args.registration_dir) / RECORD_NAME
    previous = read_record(args.registration_dir) if previous_path.is_file() else None
    try:
        record = refreeze(settings, bank, previous, args.reason, datetime.date.today().isoformat())
    except FreezeError as exc:
        print(f"not frozen: {exc}", file=sys.stderr)
        return 1
    target = write_record(record, args.registration_dir)
    print(f"froze bank {bank.sha256[:12]} and settings {settings.sha256[:12]} into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
