"""A small confirmatory rehearsal end to end (``fear rehearse``): "1 frame per fear, two depths,
one family ... asserts that confirmatory partitions hold scored rows of every block, that the
analysis fitted confirmatory rows (not pilot rows), and that the Stage 2 report lists every
block". It runs the product's own ``fear run`` / ``fear register`` on random-weight stand-ins
of the registered architectures with the registered tokenizers, in a workspace of its own.

The first test is also thinned (``Thinning``, said in every output): one pilot frame per fear,
two of the three name rotations (the probes' folds need two), two events per secondary class,
and every fit on a short sampler without the convergence remedy's extensions (``quick_fits``).
Both are marked slow (``-m slow``): the thinned one still scores about 5,000 documents through
151k-token vocabularies (about 16 documents/s on 2 cores) and samples every analysis and
simulated model with nutpie (7,218 s on 2 busy cores under the registered sampler and remedy;
gemma-2-9b with quick fits 3,551 s: benchmarks/RESULTS.md, "Rehearsal"), far beyond the 5 minutes
the default suite can give it; the unthinned one about 11,000."""

from __future__ import annotations

import json

import duckdb
import pytest

from fear_assets.core.settings import load_settings
from fear_assets.rehearsal.run import SCHEMA, rehearse
from fear_assets.rehearsal.workspace import Thinning, first_pilot_frames
from fear_assets.stimuli.bank import load_bank
from fear_assets_tests.conftest import PRIMARY


def _check(status: int, out: dict, root, depth_keys: set[str]) -> None:
    assert status == 0, out["returncodes"]
    assert out["mode"] == "confirmatory"
    failed = {name: c["detail"] for name, c in out["verified"].items() if not c["passed"]}
    assert not failed, failed
    # Every step is measured (time and its own peak memory); the scored tables say what they hold.
    assert out["steps"] and all(s["seconds"] >= 0 and s["peak_rss_mib"] for s in out["steps"])
    assert {r["table"] for r in out["scored_by_block"]} >= {"pilot_scores", "confirmatory_scores"}
    record = json.loads((root / "registration" / PRIMARY / "registration_record.json").read_text())
    assert record["status"] == "registered" and "REHEARSAL" in record["rehearsal"]
    with duckdb.connect(str(root / "fear_assets.duckdb"), read_only=True) as con:
        depths = {r[0] for r in con.execute(f"select distinct depth from {SCHEMA}.confirmatory_scores").fetchall()}
    assert depths == depth_keys


@pytest.mark.slow
def test_a_thinned_confirmatory_rehearsal_scores_every_block_fits_confirmatory_rows_and_reports_every_block(
        tmp_path):
    settings = load_settings()
    thinning = Thinning(first_pilot_frames(load_bank(settings=settings), settings.fears, 1), (1, 2), 2,
                        quick_fits=True)
    root = tmp_path / "rehearsal"
    status, out = rehearse(PRIMARY, frames=1, depths=[0, 256], root=root, thinning=thinning)
    _check(status, out, root, {"d1", "d2"})
    assert "ALSO THINNED" in out["reduction"] and "REHEARSAL" in out["reduction"]
    assert "short sampler" in out["reduction"]
    report = (root / "reports" / PRIMARY / "stage2_report.html").read_text(encoding="utf-8")
    assert "ALSO THINNED" in report


@pytest.mark.slow
def test_a_small_confirmatory_rehearsal_scores_every_block_fits_confirmatory_rows_and_reports_every_block(tmp_path):
    root = tmp_path / "rehearsal"
    status, out = rehearse(PRIMARY, frames=1, depths=[0, 256], root=root)
    _check(status, out, root, {"d1", "d2"})
