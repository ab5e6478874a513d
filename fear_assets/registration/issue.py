"""PLACEHOLDER for the issued registration record (the "mode" slice delivers the real module).

Only the two signatures the command line calls; the lead replaces this file at merge.
"""

from __future__ import annotations

from pathlib import Path


def family_mode(registration_dir: Path, family: str) -> str:
    """"pilot" | "confirmatory": confirmatory iff the family's issued record exists."""
    raise NotImplementedError("placeholder: fear_assets.registration.issue comes from the mode slice")


def issue_record(registration_dir: Path, family: str, stage1_id: str, note_file: Path, now: str) -> Path:
    """Turn the family's draft registration record into the issued one; returns its path."""
    raise NotImplementedError("placeholder: fear_assets.registration.issue comes from the mode slice")
