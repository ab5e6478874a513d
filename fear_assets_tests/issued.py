"""A registration directory in which one family's record is issued (its gates block)."""

from __future__ import annotations

import json
from pathlib import Path

from fear_assets.defs.resources.protocol import ProtocolResource


def issued_protocol(registration_dir: Path, family: str, **fields) -> ProtocolResource:
    """The protocol resource of a registration directory where ``family``'s record is issued
    (status registered, as ``registration.issue.issue_record`` writes it, with ``fields``, e.g.
    the frozen hashes) and no other is."""
    path = Path(registration_dir) / family / "registration_record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"family": family, "mode": "confirmatory", "status": "registered",
                                "stage1_id": "S1-test", "issued_at": "2026-12-01T00:00:00+00:00", **fields}))
    return ProtocolResource(registration_dir=str(registration_dir))
