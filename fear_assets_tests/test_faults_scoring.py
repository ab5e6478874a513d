"""Fault injection, scoring (issue 16): a partition's finished documents survive a crash in
chunk files, a rerun scores only what is missing, and the stored partition is old rows or
new rows, never a mix, byte-identical to an uninterrupted run.

A real scoring subprocess (a Dagster run of ``fault_scoring.fault_scores``: the resumable
loop, a tiny random model, the project's DuckDB IO manager) is killed with SIGKILL at
several points: after the first chunk, mid-partition, and inside the store's transaction.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.table import build_trial_table
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.resumable import (ChunkError, Progress, plan_chunks, read_chunk, score_resumably,
                                      scoring_salt)
from fear_assets.design.document_scores import ScoringSettings, score_requests
from fear_assets.design.requests import build_requests
from fear_assets.defs.resources.store import SCHEMA

from fear_assets_tests import fault_scoring
from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.faults import record

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]
KILL = "kill -9 of a scoring subprocess mid-partition"


@pytest.fixture(scope="module")
def partition(settings, bank, smol_tokenizer):
    """13 real documents of the embedded family (12 pilot agent documents and their baseline)."""
    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 2, toks, NAMES)
    rows = table[table.block.isin(["pilot_primary", "pilot_baseline"]) & (table.rotation == 1)]
    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, toks)
    return rows, build_requests(rows, bank.templates, builder.document_text)


@pytest.fixture(scope="module")
def tiny_engine(smol_tokenizer):
    return TeacherForcedEngine(fault_scoring.tiny_model(len(smol_tokenizer)))


def _scorer(engine, tokenizer, calls: list):
    config = ScoringSettings(context_window=4096, max_new_tokens=4, layers_fraction_from=1 / 3)

    def score(requests, _progress):
        calls.append([r.key for r in requests])
        with fault_scoring.one_thread():
            return score_requests(engine, tokenizer, requests, config)

    return score


def _same(a, b) -> None:
    la, ra, fa = a
    lb, rb, fb = b
    pd.testing.assert_frame_equal(la, lb)
    pd.testing.assert_frame_equal(ra, rb)
    assert fa.dtype == fb.dtype and fa.shape == fb.shape and fa.tobytes() == fb.tobytes()


class Interrupted(Exception):
    pass


def test_an_interrupted_partition_resumes_byte_identical_and_scores_only_the_missing_documents(
        partition, tiny_engine, smol_tokenizer, tmp_path):
    _, requests = partition
    salt = scoring_salt(model="tiny", max_new_tokens=4)
    calls: list = []
    whole = score_resumably(requests, _scorer(tiny_engine, smol_tokenizer, calls), tmp_path / "whole", salt,
                            chunk_documents=3)
    assert sum(map(len, calls)) == len(requests) == 13 and whole.progress.scored == 13

    def stop_after_two(chunk, path):
        if chunk.index == 1:
            raise Interrupted

    calls.clear()
    with pytest.raises(Interrupted):
        score_resumably(requests, _scorer(tiny_engine, smol_tokenizer, calls), tmp_path / "cut", salt,
                        chunk_documents=3, after_chunk=stop_after_two)
    assert len(list((tmp_path / "cut").glob("chunk-*.parquet"))) == 2
    calls.clear()
    seen: list[Progress] = []
    resumed = score_resumably(requests, _scorer(tiny_engine, smol_tokenizer, calls), tmp_path / "cut", salt,
                              chunk_documents=3, report=lambda p: seen.append(Progress(**vars(p))))
    scored = [k for c in calls for k in c]
    assert scored == [r.key for r in requests[6:]]  # only the missing documents
    assert resumed.progress.reused == 6 and resumed.progress.scored == 7 and resumed.progress.chunks_reused == 2
    assert [p.done for p in seen] == [6, 9, 12, 13] and seen[-1].rate > 0 and seen[-1].eta == 0
    assert "13/13 documents" in seen[-1].message() and "docs/s" in seen[-1].message()
    _same((whole.long, whole.readouts, whole.features), (resumed.long, resumed.readouts, resumed.features))
    for name in sorted(p.name for p in (tmp_path / "whole").glob("chunk-*.parquet")):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes()
    record("scoring interrupted by an exception after a chunk", 1, 1)


def test_stale_or_torn_chunks_are_never_reused(partition, tiny_engine, smol_tokenizer, tmp_path):
    _, requests = partition
    calls: list = []
    score = _scorer(tiny_engine, smol_tokenizer, calls)
    old = score_resumably(requests, score, tmp_path, scoring_salt(model="tiny", max_new_tokens=4), chunk_documents=3)
    old_files = sorted(p.name for p in tmp_path.glob("chunk-*.parquet"))
    # Another request set (another answer length: another salt, so other hashes): nothing reused.
    calls.clear()
    new_salt = scoring_salt(model="tiny", max_new_tokens=5)
    new = score_resumably(requests, score, tmp_path, new_salt, chunk_documents=3)
    assert new.progress.reused == 0 and sum(map(len, calls)) == 13
    assert sorted(new.stale_removed) == old_files and not set(old_files) & {p.name for p in tmp_path.iterdir()}
    # A request whose text changed by one character changes its chunk's name: that chunk alone is rescored.
    edited = list(requests)
    first = edited[0]
    edited[0] = type(first)(**{**vars(first), "branches": {**first.branches, "report": first.branches["report"] + " "}})
    calls.clear()
    score_resumably(edited, score, tmp_path, new_salt, chunk_documents=3)
    assert [k for c in calls for k in c] == [r.key for r in edited[:3]]
    # A torn file under a valid chunk's name (a crash mid-copy on a filesystem without atomic
    # rename), and a file whose stored hashes are another chunk's: both rescored, never trusted.
    chunks = plan_chunks(requests, new_salt, 3)
    path = tmp_path / chunks[1].filename
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    shutil.copy(tmp_path / chunks[3].filename, tmp_path / chunks[2].filename)
    assert read_chunk(tmp_path, chunks[1]) is None and read_chunk(tmp_path, chunks[2]) is None
    calls.clear()
    again = score_resumably(requests, score, tmp_path, new_salt, chunk_documents=3)
    # chunk 0 (its edited twin replaced it as stale), the torn chunk 1 and the impostor chunk 2
    assert [k for c in calls for k in c] == [r.key for r in requests[:9]]
    _same((new.long, new.readouts, new.features), (again.long, again.readouts, again.features))
    assert not np.array_equal(old.long["mean_logprob"].isna(), [True] * len(old.long))
    record("stale chunk from another request set, torn chunk file", 3, 3)


def test_a_scoring_callable_that_returns_too_little_is_an_error_not_a_short_partition(partition, tmp_path):
    _, requests = partition

    def forgetful(reqs, _):
        return pd.DataFrame(), pd.DataFrame([{"request": reqs[0].key}]), np.zeros((0, 0), np.float32)

    with pytest.raises(ChunkError, match="no readout for document"):
        score_resumably(requests, forgetful, tmp_path, "salt", chunk_documents=3)
    assert not list(tmp_path.glob("chunk-*.parquet"))


# --- kill -9 of a real scoring subprocess ---------------------------------------------------


def _stored(db: Path) -> pd.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(f"select * from {SCHEMA}.fault_scores").df()
    finally:
        con.close()


def _digest(frame: pd.DataFrame) -> str:
    buffer = io.BytesIO()
    frame.drop(columns=["generation"]).to_parquet(buffer, index=False)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


@pytest.fixture(scope="module")
def scoring_job(partition, smol_tokenizer, tmp_path_factory):
    """The job file and the reference: the partition stored by one uninterrupted run ("old")."""
    rows, requests = partition
    base = tmp_path_factory.mktemp("fault_scoring")
    job = fault_scoring.write_job(base / "job.pkl", rows, requests, smol_tokenizer)
    result = fault_scoring.materialize(job, base / "reference.duckdb", base / "reference_chunks", generation="old")
    assert result.success
    # The chunks are discarded once the store holds the partition (after the IO manager wrote it).
    assert not (base / "reference_chunks").exists()
    # Progress in the run log and, as asset observations, in the run's metadata in the UI.
    observed = [e.event_specific_data.asset_observation.metadata for e in result.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    assert observed and observed[-1]["documents done"].value == len(requests) == observed[-1]["documents"].value
    assert {"documents/s", "ETA s", "chunks", "chunks reused"} <= set(observed[-1])
    reference = _stored(base / "reference.duckdb")
    assert len(reference) == len(rows) and (reference.generation == "old").all()
    return job, base, reference, requests


def _finished_chunks(requests: list, chunks: Path) -> list:
    """The planned chunks of the fault job that a stopped run left complete on disk."""
    planned = plan_chunks(requests, scoring_salt(model="tiny-random-llama-seed-0",
                                                 config=vars(ScoringSettings(4096, 4, 1 / 3))), 3)
    return [c for c in planned if read_chunk(chunks, c) is not None]


def _kill_at(job: Path, db: Path, chunks: Path, marker: str, extra: list[str],
             sig: int = signal.SIGKILL) -> tuple[int, list[str]]:
    """Run the scoring subprocess and send it ``sig`` when it prints ``marker``. A SIGTERM is
    left to act (the process must end by itself within 60 s: a pod's grace period is 30 s by
    default), and only then is the process killed, so a process that ignores it fails here."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fear_assets_tests.fault_scoring", str(job), str(db), str(chunks),
                             "new", *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines, deadline = [], time.monotonic() + 240
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.strip() == marker:
                proc.send_signal(sig)
                if sig != signal.SIGKILL:
                    lines.extend(proc.communicate(timeout=60)[0].splitlines())
                break
            if time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None and marker != "FAULT-INSIDE-TRANSACTION":
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return proc.returncode, lines


@pytest.mark.parametrize("marker,extra", [("FAULT-CHUNK 0", []), ("FAULT-CHUNK 2", []),
                                          ("FAULT-INSIDE-TRANSACTION", ["--die-in-store"])],
                         ids=["after-first-chunk", "mid-partition", "inside-store-transaction"])
def test_kill_9_mid_partition_leaves_old_or_new_rows_and_the_rerun_completes_it(scoring_job, tmp_path, marker,
                                                                                 extra):
    job, base, reference, requests = scoring_job
    db, chunks = tmp_path / "store.duckdb", tmp_path / "chunks"
    shutil.copy(base / "reference.duckdb", db)  # the partition holds the old rows
    code, lines = _kill_at(job, db, chunks, marker, extra)
    assert code == -signal.SIGKILL, lines[-20:]
    assert marker in lines, lines[-20:]
    after_kill = _stored(db)
    generations = set(after_kill.generation)
    never_mixed = len(generations) == 1 and len(after_kill) == len(reference) \
        and _digest(after_kill) == _digest(reference)
    # What survived the kill: finished chunks (complete and named by their requests) only.
    kept = _finished_chunks(requests, chunks)
    result = fault_scoring.materialize(job, db, chunks, generation="new")
    meta = result.asset_materializations_for_node("fault_scores")[0].metadata
    final = _stored(db)
    lost = len(set(reference.trial_id) - set(final.trial_id))
    duplicated = len(final) - final.trial_id.nunique()
    survived = (result.success and never_mixed and (final.generation == "new").all()
                and _digest(final) == _digest(reference)
                and meta["documents scored in this run"].value == len(requests) - sum(len(c.requests) for c in kept)
                and meta["documents reused from finished chunks"].value == sum(len(c.requests) for c in kept))
    record(KILL, 1, int(survived), rows_lost=lost, rows_duplicated=duplicated)
    assert never_mixed, f"after the kill the partition holds {sorted(generations)} ({len(after_kill)} rows)"
    assert generations == {"old"}  # the kill came before any commit
    if marker.startswith("FAULT-CHUNK"):
        assert len(kept) >= int(marker.split()[1]) + 1
    assert result.success and lost == 0 and duplicated == 0
    assert meta["documents scored in this run"].value == len(requests) - sum(len(c.requests) for c in kept)
    assert _digest(final) == _digest(reference) and (final.generation == "new").all()
    assert not chunks.exists()
    assert json.loads(json.dumps(meta["documents/s"].value)) >= 0


def test_sigterm_mid_partition_ends_the_step_keeps_the_old_rows_and_its_finished_chunks(scoring_job, tmp_path):
    """What a Kubernetes pod's eviction or a scheduler's stop sends: SIGTERM while a partition
    is being scored. The step must end by itself (Dagster turns the signal into an interrupt
    inside the step), the store must keep the partition's old rows (no half-written
    partition), and the chunks finished before it must be kept so that the rerun scores only
    the rest."""
    job, base, reference, requests = scoring_job
    db, chunks = tmp_path / "store.duckdb", tmp_path / "chunks"
    shutil.copy(base / "reference.duckdb", db)
    code, lines = _kill_at(job, db, chunks, "FAULT-CHUNK 1", [], sig=signal.SIGTERM)
    assert code not in (0, -signal.SIGKILL), lines[-20:]  # ended by the signal, by itself
    after = _stored(db)
    assert set(after.generation) == {"old"} and _digest(after) == _digest(reference)
    kept = _finished_chunks(requests, chunks)
    assert len(kept) >= 2
    result = fault_scoring.materialize(job, db, chunks, generation="new")
    meta = result.asset_materializations_for_node("fault_scores")[0].metadata
    final = _stored(db)
    assert result.success and (final.generation == "new").all() and _digest(final) == _digest(reference)
    assert meta["documents reused from finished chunks"].value == sum(len(c.requests) for c in kept)


# --- the scores asset itself resumes -----------------------------------------------------------


def test_the_scores_asset_resumes_from_chunks_and_reports_progress(partition, smol_tokenizer, tmp_path, monkeypatch):
    """The registered ``pilot_scores`` asset (direct invocation, a tiny random model in place of the
    checkpoint): a first run that dies after two chunks leaves them on disk; the rerun reuses
    them, says so in its output metadata and progress observations, equals an uninterrupted
    run, and discards the chunks once the output is handed to the store."""
    import dagster as dg

    from fear_assets.defs import progress
    from fear_assets.defs.assets.pilot import scoring as scoring_assets
    from fear_assets.defs.partitions import partition_key
    from fear_assets.lm import resumable
    from fear_assets.defs.resources.models import LanguageModelResource
    from fear_assets.defs.resources.protocol import ProtocolResource

    rows, _ = partition
    model = fault_scoring.tiny_model(len(smol_tokenizer))

    class TinyModel(LanguageModelResource):
        def load(self, spec, expected_files=None):
            return model, smol_tokenizer

    monkeypatch.setattr(resumable, "CHUNK_DOCUMENTS", 3)
    monkeypatch.setattr(resumable.score_resumably, "__kwdefaults__",
                        {**resumable.score_resumably.__kwdefaults__, "chunk_documents": 3})
    protocol = ProtocolResource(cache_dir=str(tmp_path / "cache"))
    key = partition_key(EMBEDDED, "d2")
    table = rows.assign(selected_names=json.dumps(NAMES)) if "selected_names" not in rows else rows
    chunk_dir = resumable.chunk_directory(protocol.cache_dir, EMBEDDED, "d2", "tested")

    def run(after_chunk=None):
        # The shell's progress module holds the name the asset calls.
        original = progress.score_resumably
        if after_chunk:
            monkeypatch.setattr(progress, "score_resumably",
                                lambda *a, **k: original(*a, **{**k, "after_chunk": after_chunk}))
        try:
            with dg.build_asset_context(partition_key=key) as context:
                events = list(scoring_assets.pilot_scores(context, protocol=protocol, language_model=TinyModel(),
                                                          pilot_trial_table=table, model_manifest=pd.DataFrame(
                                                              {"checkpoint": [], "file": [], "sha256": []})))
        finally:
            monkeypatch.setattr(progress, "score_resumably", original)
        return events

    def die(chunk, path):
        if chunk.index == 1:
            raise Interrupted

    with fault_scoring.one_thread():
        with pytest.raises(Interrupted):
            run(die)
        assert len(list(chunk_dir.glob("chunk-*.parquet"))) == 2
        resumed = [e for e in run() if isinstance(e, dg.Output)][0]
        assert not chunk_dir.parent.exists()  # discarded once the output was handed over
        whole = [e for e in run() if isinstance(e, dg.Output)][0]
    def per_reader(output, reader="tested"):  # one table row per reader
        return next(r.data for r in output.metadata["resumed scoring (per reader)"].records if r.data["reader"] == reader)

    meta = per_reader(resumed)
    assert meta["documents"] == "13" and meta["documents reused from finished chunks"] == "6"
    assert meta["documents scored in this run"] == "7" and meta["chunks reused"] == "2"
    assert per_reader(whole)["documents reused from finished chunks"] == "0"
    pd.testing.assert_frame_equal(resumed.value, whole.value)


# --- documents over the window, truncated answers, NaN and infinite log-probabilities ---------


def test_over_window_truncated_and_nonfinite_trials_are_flagged_with_reasons_and_counted(
        partition, tiny_engine, smol_tokenizer, settings):
    from fear_assets.models.data import kept
    from fear_assets.models.exclusions import exclusion_rates
    from fear_assets.design.trial_scores import assemble

    rows, requests = partition
    lengths = {r.key: max(len(smol_tokenizer.encode(t, add_special_tokens=False)) for t in r.branches.values())
               for r in requests}
    agent_lengths = sorted(v for k, v in lengths.items() if "baseline" not in k)
    window = agent_lengths[len(agent_lengths) // 2]  # about half the agent documents exceed it
    config = ScoringSettings(context_window=window, max_new_tokens=4, layers_fraction_from=1 / 3)
    with fault_scoring.one_thread():
        long, readouts, _ = score_requests(tiny_engine, smol_tokenizer, requests, config)
    # Inject: NaN, -inf and +inf log-probabilities into three scored agent documents, an
    # infinite forced-choice log-probability into a fourth.
    scored = [k for k in long.request.unique() if "baseline" not in k]
    injected = dict(zip(scored[:3], [float("nan"), float("-inf"), float("inf")]))
    long = long.copy()
    for key, value in injected.items():
        first = long.index[long.request == key][0]
        long.loc[first, ["mean_logprob", "sum_logprob"]] = value
    readouts = readouts.copy()
    fc_target = next(k for k in scored[3:] if readouts.set_index("request").loc[k, "forced_choice_choice_logprobs"])
    at = readouts.index[readouts.request == fc_target][0]
    readouts.loc[at, "forced_choice_choice_logprobs"] = json.dumps([float("-inf"), -0.5])
    table = assemble(rows, long, readouts)
    over = {k for k, n in lengths.items() if n > window}
    agent = table[table.block == "pilot_primary"]
    context_ok = (set(table.loc[table.excluded_context, "trial_id"]) == over
                  and table.loc[table.excluded_context, "exclusion_reason"].str.contains(f"context window is {window}").all())
    truncated = agent[~agent.excluded_context]
    truncated_ok = bool(truncated.generation_truncated.all()) and len(truncated) > 0
    flagged = set(table.loc[table.nonfinite_logprob, "trial_id"])
    nonfinite_ok = (flagged == {*injected, fc_target}
                    and table.loc[table.nonfinite_logprob, "exclusion_reason"].str.contains("non-finite").all()
                    and table.set_index("trial_id").loc[fc_target, "p_option1"] != table.set_index("trial_id").loc[
                        fc_target, "p_option1"])  # NaN: no choice read from an infinite log-probability
    rates = exclusion_rates(table.assign(agent="self", content="threat"), flag_rate=0.05)
    counted = (int(rates.excluded_context.sum()) == len(over) and int(rates.nonfinite_logprob.sum()) == 4
               and int(rates.generation_truncated.sum()) == int(table.generation_truncated.sum()))
    remaining = kept(table)
    lost = len(set(rows.trial_id) - set(table.trial_id))  # every trial has its row, flagged or not
    dropped_silently = len(table) - len(remaining) - int(
        (table.excluded_context | table.generation_truncated | table.nonfinite_logprob).sum())
    record("document over the context window", len(over), len(over) if context_ok and counted else 0, rows_lost=lost)
    record("generation truncated by the length limit", len(truncated), len(truncated) if truncated_ok else 0)
    record("NaN or infinite log-probability", 4, 4 if nonfinite_ok and counted else 0)
    assert 0 < len(over) < len(requests) and context_ok and truncated_ok and nonfinite_ok and counted
    assert lost == 0 and dropped_silently == 0
    assert not remaining.nonfinite_logprob.any() and not remaining.excluded_context.any()
