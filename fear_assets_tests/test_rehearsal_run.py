"""A small confirmatory rehearsal end to end (``fear rehearse``): "1 frame per fear, two depths,
one family ... asserts that confirmatory partitions hold scored rows of every block, that the
analysis fitted confirmatory rows (not pilot rows), and that the Stage 2 report lists every
block". It runs the product's own ``fear run`` / ``fear register`` on random-weight stand-ins
of the registered architectures with the registered tokenizers, in a workspace of its own.

Marked slow: on 2 cores it scores about 11,000 documents through 151k-token vocabularies and
fits every analysis model, far more than the default suite's budget (docs/rehearsal.md has
the measured time); run it with ``-m slow``."""

from __future__ import annotations

import json

import duckdb
import pytest

from fear_assets.rehearsal.run import SCHEMA, rehearse
from fear_assets_tests.conftest import PRIMARY


@pytest.mark.slow
def test_a_small_confirmatory_rehearsal_scores_every_block_fits_confirmatory_rows_and_reports_every_block(tmp_path):
    status, out = rehearse(PRIMARY, frames=1, depths=[0, 256], root=tmp_path / "rehearsal")
    assert status == 0, out["returncodes"]
    assert out["mode"] == "confirmatory"
    failed = {name: c["detail"] for name, c in out["verified"].items() if not c["passed"]}
    assert not failed, failed
    # Every step is measured (time and its own peak memory); the scored tables say what they hold.
    assert out["steps"] and all(s["seconds"] >= 0 and s["peak_rss_mib"] for s in out["steps"])
    assert {r["table"] for r in out["scored_by_block"]} >= {"pilot_scores", "confirmatory_scores"}
    root = tmp_path / "rehearsal"
    record = json.loads((root / "registration" / PRIMARY / "registration_record.json").read_text())
    assert record["status"] == "registered" and "REHEARSAL" in record["rehearsal"]
    with duckdb.connect(str(root / "fear_assets.duckdb"), read_only=True) as con:
        depths = {r[0] for r in con.execute(f"select distinct depth from {SCHEMA}.confirmatory_scores").fetchall()}
    assert depths == {"d1", "d2"}
