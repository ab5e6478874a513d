"""Analyzer hard failures (exit status 2, one message naming the job), validity rules,
exclusions, and the synthetic-evidence statement."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from renaming_assets import analyze as cli
from renaming_assets.analyze import analyze
from renaming_assets.bundle import PLAN
from renaming_assets.settings import SETTINGS
from renaming_assets.synthetic import write_synthetic_log

from renaming_assets_tests.conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent


def _lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fails(capsys, bundle, *logs, out) -> str:
    code = cli.main([str(bundle), *map(str, logs), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not out.exists()
    assert err[0].startswith("renaming analyze: ")
    return err[0][len("renaming analyze: "):]


def _edit(rows, i, fn):
    rows = json.loads(json.dumps(rows))
    fn(rows[i])
    return rows


CASES = {
    "reordered candidates": lambda r: r["body"]["alternatives"].reverse(),
    "request body of job": lambda r: r["body"].__setitem__("state", r["body"]["state"].replace(" -> ", " => ", 1)),
    "body_sha256 of job": lambda r: r.__setitem__("body_sha256", "0" * 64),
    "expected labels of job": lambda r: r["expected"].__setitem__("gold", "A" if r["expected"]["gold"] != "A" else "B"),
    "metadata of job": lambda r: r["metadata"].__setitem__("world_index", 99),
    "mixed synthetic/real evidence: job": lambda r: r.__setitem__("synthetic", False),
}


@pytest.mark.parametrize("needle", list(CASES))
def test_row_mismatches_are_hard_failures(capsys, tmp_path, small_bundle, small_log, needle):
    rows = _lines(small_log)
    i = 17
    message = _fails(capsys, small_bundle, _write(tmp_path / "log.jsonl", _edit(rows, i, CASES[needle])),
                     out=tmp_path / "result.json")
    assert needle in message and repr(rows[i]["job"]) in message


def test_duplicates_unplanned_and_missing(capsys, tmp_path, small_bundle, small_log):
    rows = _lines(small_log)
    extra = _write(tmp_path / "second.jsonl", [rows[5]])
    message = _fails(capsys, small_bundle, small_log, extra, out=tmp_path / "r.json")
    assert message.startswith(f"duplicate attempt for job {rows[5]['job']!r}")
    assert "second.jsonl line 1" in message

    unplanned = _edit(rows, 3, lambda r: r.__setitem__("job", "recursive-999:shuffled:root:original:copy1"))
    message = _fails(capsys, small_bundle, _write(tmp_path / "u.jsonl", unplanned), out=tmp_path / "r.json")
    assert message.startswith("unplanned job 'recursive-999:shuffled:root:original:copy1'")

    message = _fails(capsys, small_bundle, _write(tmp_path / "m.jsonl", rows[:40] + rows[41:]), out=tmp_path / "r.json")
    assert message.startswith(f"missing attempt for planned job {rows[40]['job']!r} (1 planned jobs have no row)")

    # One log split across two files is fine (exactly one attempt per job overall).
    a, b = _write(tmp_path / "a.jsonl", rows[:100]), _write(tmp_path / "b.jsonl", rows[100:])
    assert cli.main([str(small_bundle), str(a), str(b), "--out", str(tmp_path / "ok.json")]) == 0


def test_frozen_hashes_are_verified_first(capsys, tmp_path, small_bundle, small_log):
    bundle = tmp_path / "bundle"
    shutil.copytree(small_bundle, bundle)
    with open(bundle / "audit.json", "a") as f:
        f.write(" ")
    message = _fails(capsys, bundle, small_log, out=tmp_path / "r.json")
    assert "audit.json: artifact hash does not match" in message
    shutil.copy(small_bundle / "audit.json", bundle / "audit.json")
    freeze = json.loads((bundle / "freeze.json").read_text())
    freeze["sources"]["settings.py"] = "0" * 64
    (bundle / "freeze.json").write_text(json.dumps(freeze))
    assert "frozen source settings.py differs" in _fails(capsys, bundle, small_log, out=tmp_path / "r.json")


def test_exit_status_two_from_the_command_line(tmp_path, small_bundle, small_log):
    rows = _lines(small_log)
    log = _write(tmp_path / "log.jsonl", rows + [rows[0]])
    proc = subprocess.run([sys.executable, "-m", "renaming_assets.analyze", str(small_bundle), str(log),
                           "--out", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"renaming analyze: duplicate attempt for job {rows[0]['job']!r}: {log} line 1 and {log} line "
        f"{len(rows) + 1}; exactly one attempted row per planned job is allowed"]


def test_synthetic_result_first_line_and_figures(tmp_path, small_bundle, small_log):
    out = tmp_path / "result.json"
    assert cli.main([str(small_bundle), str(small_log), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.splitlines()[0].startswith('{"evidence": "SYNTHETIC EVIDENCE')
    result = json.loads(text)
    assert result["synthetic"] is True and result["attempted_rows"] == result["planned_jobs"] == 432
    assert result["registered_cohort"] is False  # a reduced test bundle
    endpoints = result["primary"]["endpoints"]
    assert [e["endpoint"] for e in endpoints] == ["constrained:shuffled:root", "constrained:shuffled:fourth_ancestor"]
    for e in endpoints:
        lo, hi = e["interval_95"]
        assert -0.5 <= lo <= e["estimate"] <= hi <= 1
        assert 1 / 10_001 <= e["p_sign_flip"] <= 1 and e["p_holm"] >= e["p_sign_flip"]
        low, high = e["missing_outcome_bounds"]
        assert low == pytest.approx(high) == pytest.approx(e["estimate"])  # nothing missing
        assert e["complete_worlds"] == {"recursive": 4, "spine_fan": 4, "clustered": 4}
    contrasts = result["secondary"]["contrasts"]
    assert len(contrasts) == 12 and len(result["secondary"]["constrained_minus_unrestricted_excess"]) == 6
    for k in ("excess", "cross", "repeat", "accuracy_change", "repair", "harm", "half_l1_cross", "half_l1_repeat"):
        assert contrasts["unrestricted:grouped:parent"][k]["estimate"] is not None
    assert "p_sign_flip" not in contrasts["unrestricted:grouped:parent"]["excess"]
    assert result["available_calls"]["original:shuffled:root"]["planned_calls"] == 24


def test_failures_exclude_only_the_contrasts_that_need_them(tmp_path, small_bundle, small_plan):
    cell = [r for r in small_plan if r["layout"] == "shuffled" and r["task"] == "root"]
    world = cell[0]["world"]
    failed = f"{world}:shuffled:root:constrained:copy1"
    bad_vector = f"{world}:shuffled:root:unrestricted:copy2"
    log = write_synthetic_log(small_bundle / PLAN, tmp_path / "log.jsonl", SMALL,
                              faults={failed: "http_500", bad_vector: "bad_probabilities"})
    result = analyze(small_bundle, [log], SMALL)
    assert result["validity"]["failure_categories"] == {"http_status": 1}
    assert result["validity"]["failed_jobs"] == [failed]
    constrained = result["primary"]["endpoints"][0]
    assert constrained["excluded_worlds"] == {world: [failed]}
    assert sum(constrained["complete_worlds"].values()) == 11
    low, high = constrained["missing_outcome_bounds"]
    assert low <= constrained["estimate"] <= high
    assert high - low == pytest.approx(1.5 / 4 / 3)  # one of four worlds of one family, range 1.5
    unrestricted = result["secondary"]["contrasts"]["unrestricted:shuffled:root"]
    # The invalid probability map does not erase the label; the failure elsewhere excludes nothing here.
    assert unrestricted["excess"]["excluded_worlds"] == {}
    assert unrestricted["half_l1_cross"]["excluded_worlds"] == {world: [bad_vector]}
    diff = result["secondary"]["constrained_minus_unrestricted_excess"]["shuffled:root"]
    assert diff["excluded_worlds"] == {world: [failed]}


def test_equal_family_mean_undefined_when_a_family_has_no_complete_world(tmp_path, small_bundle, small_plan):
    faults = {r["job"]: "unvalidated" for r in small_plan if r["family"] == "spine_fan" and r["layout"] == "shuffled"
              and r["task"] == "fourth_ancestor" and r["naming"] == "constrained" and r["copy"] == 1}
    log = write_synthetic_log(small_bundle / PLAN, tmp_path / "log.jsonl", SMALL, faults=faults)
    result = analyze(small_bundle, [log], SMALL)
    root, fourth = result["primary"]["endpoints"]
    assert fourth["estimate"] is None and fourth["available"] is False and fourth["p_holm"] is None
    # Holm keeps a family of two: the available endpoint's p is doubled.
    assert root["p_holm"] == pytest.approx(min(1.0, 2 * root["p_sign_flip"]))
    assert result["registered_cohort"] is False
    assert fourth["missing_outcome_bounds"][0] < fourth["missing_outcome_bounds"][1]
    assert SETTINGS.inference.family_size == 2
