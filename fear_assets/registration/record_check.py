"""Whether a run matches the family's registration record (D6): its frozen part (settings,
bank, model manifest, analysis code, supplementary note)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

from fear_assets.core.settings import ProtocolSettings
from fear_assets.lm.models import manifest_digest
from fear_assets.registration.compose import note_now
from fear_assets.registration.record import analysis_code_sha256, frozen_differences
from fear_assets.stimuli.bank import Bank


@dataclass(frozen=True)
class RecordMatch:
    passed: bool
    #: Only a registered record is frozen; a draft or refused one is rewritten by the next
    #: registration_record run (the fix after a failed gate), so differing from it only warns.
    frozen: bool
    description: str
    differences: int


def record_match(record: Mapping[str, Any], settings: ProtocolSettings, bank: Bank,
                 model_manifest: pd.DataFrame) -> RecordMatch:
    """The current inputs against the record's frozen part, and what to do on a difference."""
    current = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
               "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256(),
               **note_now(record)}
    diffs = frozen_differences(record, current)
    registered_record = record["status"] == "registered"
    return RecordMatch(
        passed=not diffs, frozen=registered_record,
        description=f"matches the {record['status']} registration record" if not diffs else
        "differs from the " + record["status"] + " registration record: " + "; ".join(diffs) +
        (". Restore the registered inputs, or file an amendment." if registered_record else
         ". The pilot's draft record is rewritten when registration_record is next materialised."),
        differences=len(diffs))
