"""The freeze record of the registered inputs and the check against it (D6).

``data/registration/frozen_inputs.json`` holds the bank's and the settings' canonical
sha256 together with per-item and per-section hashes. :func:`compare_with_record` names
exactly what changed (which bank item, which settings section), so a failed freeze check
tells the researcher what to restore or to re-register.

Freeze the current inputs with ``python -m fear_assets.registration.freeze``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fear_assets.errors import FreezeError
from fear_assets.settings import DEFAULT_BANK_DIR, DEFAULT_REGISTRATION_DIR, DEFAULT_SETTINGS_PATH, ProtocolSettings, load_settings
from fear_assets.stimuli.bank import Bank, load_bank

RECORD_NAME = "frozen_inputs.json"


def freeze_record(settings: ProtocolSettings, bank: Bank) -> dict:
    return {
        "protocol": settings.raw["protocol"]["name"],
        "protocol_version": settings.raw["protocol"]["version"],
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


def _diff(kind: str, now: dict[str, str], frozen: dict[str, str]) -> list[str]:
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
    changed = _diff("bank", now["bank_items"], record.get("bank_items", {})) + \
        _diff("settings section", now["settings_sections"], record.get("settings_sections", {}))
    passed = now["bank_sha256"] == record.get("bank_sha256") and now["settings_sha256"] == record.get("settings_sha256")
    if not passed and not changed:
        changed = ["canonical hashes differ although no item or section hash does (record edited by hand?)"]
    return FreezeComparison(passed=passed, bank_sha256=now["bank_sha256"], settings_sha256=now["settings_sha256"],
                            frozen_bank_sha256=record.get("bank_sha256", ""),
                            frozen_settings_sha256=record.get("settings_sha256", ""), changed=changed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings_path = Path(argv[0]) if len(argv) > 0 else DEFAULT_SETTINGS_PATH
    bank_dir = Path(argv[1]) if len(argv) > 1 else DEFAULT_BANK_DIR
    registration_dir = Path(argv[2]) if len(argv) > 2 else DEFAULT_REGISTRATION_DIR
    settings = load_settings(settings_path)
    bank = load_bank(bank_dir, settings)
    target = write_record(freeze_record(settings, bank), registration_dir)
    print(f"froze bank {bank.sha256[:12]} and settings {settings.sha256[:12]} into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
