"""Fault injection, the instance (issue 27): a crash must not wedge it.

A real run of a real scoring step (``fault_scoring.fault_scores``: the resumable loop, a tiny
random model, the project's DuckDB IO manager) holds the only slot of pool ``gpu``; it is
launched through a real instance (the project's instance YAML in a temporary
``DAGSTER_HOME``) with ``dagster-daemon`` running, and its worker is killed with SIGKILL
mid-partition. The run must be marked failed and its slot freed within a bounded time by
Dagster's own run monitoring, and a rerun queued behind it must proceed with no manual action
and resume from the finished chunks. Both instance configurations: the embedded
``dagster.yaml`` (SQLite) and ``deploy/dagster.postgres.yaml`` (a throwaway Postgres).

And: Dagster code started from another directory with ``DAGSTER_HOME`` set opens the project's
instance, not an empty one in its current directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest
import yaml

from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.table import build_trial_table
from fear_assets.design.requests import build_requests
from fear_assets.defs.resources.store import SCHEMA

from fear_assets_tests import fault_scoring
from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.faults import record
from fear_assets_tests.processes import stop_group, wait_while_alive

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]
CONFIGS = {"embedded": ROOT / "dagster.yaml", "postgres": ROOT / "deploy" / "dagster.postgres.yaml"}
#: The test instance waits less between monitoring passes than production does; only waits
#: already in the project's YAML are shortened (a rule missing there stays missing here).
SHORTER_WAITS = {"poll_interval_seconds": 1, "free_slots_after_run_end_seconds": 1}
#: The first run waits this long after its second chunk (index 1), so the kill lands mid-partition.
PAUSE_S = 600
#: The bound a kill must be cleared within, on the test's shortened waits (generous for a loaded CI host).
BOUND_S = 60
CHUNKS_BEFORE_KILL = 2


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def scoring_job(settings, bank, smol_tokenizer, tmp_path_factory):
    """13 real documents of the embedded family (12 pilot agent documents and their baseline)."""
    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 2, toks, NAMES)
    rows = table[table.block.isin(["pilot_primary", "pilot_baseline"]) & (table.rotation == 1)]
    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, toks)
    requests = build_requests(rows, bank.templates, builder.document_text)
    job = fault_scoring.write_job(tmp_path_factory.mktemp("monitor_job") / "job.pkl", rows, requests, smol_tokenizer)
    return job, rows, requests


def test_the_project_instances_monitor_runs_and_free_a_dead_runs_slots():
    """What production runs with: monitoring on, a dead run's slots freed after a bounded wait."""
    for name, path in CONFIGS.items():
        monitoring = yaml.safe_load(path.read_text(encoding="utf-8")).get("run_monitoring") or {}
        assert monitoring.get("enabled") is True, (name, monitoring)
        # Dagster treats 0 or a missing value as "never free them"
        assert 0 < int(monitoring.get("free_slots_after_run_end_seconds") or 0) <= 60, (name, monitoring)
        assert 0 < int(monitoring.get("poll_interval_seconds") or 0) <= 60, (name, monitoring)


def _instance_yaml(config: str) -> str:
    cfg = yaml.safe_load(CONFIGS[config].read_text(encoding="utf-8"))
    monitoring = cfg.get("run_monitoring")
    for key, value in SHORTER_WAITS.items():
        if isinstance(monitoring, dict) and key in monitoring:
            monitoring[key] = value
    return yaml.safe_dump(cfg, sort_keys=False)


@pytest.fixture
def postgres_env():
    from fear_assets_tests.postgres_server import temporary_postgres

    with temporary_postgres() as server:
        server.create_database("dagster")
        yield {"DAGSTER_PG_HOST": server.host, "DAGSTER_PG_PORT": str(server.port), "DAGSTER_PG_USER": server.user,
               "DAGSTER_PG_PASSWORD": "", "DAGSTER_PG_DB": "dagster"}


@contextmanager
def _daemon(cwd: Path, env: dict, log_path: Path):
    with open(log_path, "w") as log:
        # its own process group: the code server it spawns (and its run workers) stop with it
        daemon = subprocess.Popen([_bin("dagster-daemon"), "run", "-w", str(cwd / "workspace.yaml")], cwd=cwd, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield daemon
    finally:
        stop_group(daemon)


def _launch(cwd: Path, env: dict, run_id: str, pause_s: float) -> subprocess.Popen:
    """``dagster job launch``: the run is queued on the instance, and the daemon launches it."""
    config = {"ops": {"fault_scores": {"config": {"generation": "new", "pause_after_chunk": CHUNKS_BEFORE_KILL - 1,
                                                  "pause_s": pause_s}}}}
    return subprocess.Popen([_bin("dagster"), "job", "launch", "-w", str(cwd / "workspace.yaml"), "-j", "__ASSET_JOB",
                             "--run-id", run_id, "--tags", json.dumps({"dagster/partition": fault_scoring.PARTITION}),
                             "--config-json", json.dumps(config)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _launched(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]


def _worker_pid(instance, run_id: str) -> int | None:
    from dagster import DagsterEventType

    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        if entry.message.startswith("Started process for run"):  # the code server's run worker
            return int(entry.dagster_event.event_specific_data.metadata["pid"].value)
    return None


def _kill_tree(pid: int) -> None:
    """SIGKILL the run worker and its step processes at once (the worker's host gone, OOM kill)."""
    import psutil

    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def _gpu_holders(instance) -> set[str]:
    info = instance.event_log_storage.get_concurrency_info("gpu")
    return {slot.run_id for slot in info.claimed_slots}


# The Postgres instance variant is slow (about 2.5 minutes beside the suite): the default run keeps
# the fault on the embedded instance, and Postgres through test_store_concurrency; -m slow runs it.
@pytest.mark.parametrize("config", ["embedded", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.slow])])
def test_kill_9_of_a_scoring_run_frees_the_gpu_slot_and_the_queued_rerun_resumes(config, scoring_job, tmp_path,
                                                                                 request, monkeypatch):
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus

    job, rows, requests = scoring_job
    home, local, chunks, db = tmp_path / "home", tmp_path / "local", tmp_path / "chunks", tmp_path / "store.duckdb"
    home.mkdir()
    local.mkdir()
    (home / "dagster.yaml").write_text(_instance_yaml(config), encoding="utf-8")
    (tmp_path / "workspace.yaml").write_text(
        "load_from:\n  - python_module:\n      module_name: fear_assets_tests.fault_scoring_location\n"
        f"      working_directory: {ROOT}\n      location_name: fault_scoring\n")
    env = {"DAGSTER_HOME": str(home), "DAGSTER_LOCAL_DIR": str(local), "FEAR_FAULT_JOB": str(job),
           "FEAR_FAULT_DB": str(db), "FEAR_FAULT_CHUNKS": str(chunks), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if config == "postgres":
        env.update(request.getfixturevalue("postgres_env"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, **env}
    instance = DagsterInstance.get()
    first, rerun = str(uuid.uuid4()), str(uuid.uuid4())
    log = tmp_path / "daemon.log"
    with _daemon(tmp_path, env, log) as daemon:
        _launched(_launch(tmp_path, env, first, PAUSE_S))
        # The step holds the gpu slot and has finished CHUNKS_BEFORE_KILL chunks (then pauses).
        wait_while_alive("first run scoring", lambda: len(list(chunks.glob("chunk-*.parquet"))) >= CHUNKS_BEFORE_KILL
              and first in _gpu_holders(instance), 300, daemon, log)
        pid = _worker_pid(instance, first)
        assert pid, "no run worker pid in the first run's event log"
        finished_at_kill = len(list(chunks.glob("chunk-*.parquet")))
        _kill_tree(pid)
        killed = time.monotonic()
        # The rerun is queued at once, by nobody who knows the first run died (its launch runs
        # while the clocks below run).
        relaunch = _launch(tmp_path, env, rerun, 0)
        try:
            failed = wait_while_alive("killed run marked failed", lambda: instance.get_run_by_id(first).status
                           == DagsterRunStatus.FAILURE and time.monotonic(), BOUND_S, daemon, log)
            freed = wait_while_alive("killed run's gpu slot freed", lambda: first not in _gpu_holders(instance)
                          and time.monotonic(), BOUND_S, daemon, log)
        except BaseException:
            relaunch.kill()  # not left behind when the test fails
            raise
        _launched(relaunch)
        wait_while_alive("rerun finished", lambda: instance.get_run_by_id(rerun).status in
                     (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED), 300, daemon, log)
        rerun_status = instance.get_run_by_id(rerun).status
        holders_after = _gpu_holders(instance)
    materialization = instance.get_latest_materialization_event(AssetKey("fault_scores"))
    meta = {k: v.value for k, v in materialization.asset_materialization.metadata.items()} if materialization else {}
    reused = meta.get("documents reused from finished chunks")
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute(f"select trial_id, generation from {SCHEMA}.fault_scores").df()
    to_failed, to_freed = failed - killed, freed - killed
    print(f"\n[{config}] kill -9 -> run marked failed {to_failed:.1f} s, gpu slot freed {to_freed:.1f} s; rerun "
          f"{rerun_status.value}, reused {reused} of {len(requests)} documents ({finished_at_kill} chunks at the kill)")
    survived = (rerun_status == DagsterRunStatus.SUCCESS and not holders_after and to_freed <= BOUND_S
                and reused == finished_at_kill * fault_scoring.CHUNK_DOCUMENTS)
    record(f"kill -9 of a scoring run holding the gpu slot ({config} instance)", 1, int(survived),
           rows_lost=len(set(rows.trial_id) - set(stored.trial_id)), rows_duplicated=len(stored) - stored.trial_id.nunique())
    assert rerun_status == DagsterRunStatus.SUCCESS, log.read_text()[-3000:]
    assert not holders_after  # no slot left held by anyone
    assert reused == finished_at_kill * fault_scoring.CHUNK_DOCUMENTS and 0 < reused < len(requests), meta
    assert meta["documents scored in this run"] == len(requests) - reused
    assert sorted(stored.trial_id) == sorted(rows.trial_id) and (stored.generation == "new").all()
    assert not chunks.exists()  # discarded once the store held the partition


def test_dagster_started_from_another_directory_uses_the_projects_instance(tmp_path, monkeypatch):
    """The project's embedded dagster.yaml in a DAGSTER_HOME; a run recorded from that directory
    is seen by Dagster code started in another one, which writes nothing where it stands."""
    import dagster as dg

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / "dagster.yaml").write_text(CONFIGS["embedded"].read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    @dg.asset
    def where_am_i():
        return 1

    def runs_at_home() -> list[str]:
        monkeypatch.chdir(home)
        with dg.DagsterInstance.get() as instance:
            return [r.run_id for r in instance.get_runs()]

    monkeypatch.chdir(home)
    with dg.DagsterInstance.get() as instance:
        made_at_home = dg.materialize([where_am_i], instance=instance).run_id
    # Another process, started in another directory, with DAGSTER_HOME set: records a run, lists the runs.
    script = ("import dagster as dg\n"
              "@dg.asset\ndef where_am_i():\n    return 1\n"
              "instance = dg.DagsterInstance.get()\n"
              "print('RUN', dg.materialize([where_am_i], instance=instance).run_id)\n"
              "print('RUNS', ' '.join(r.run_id for r in instance.get_runs()))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {line.split(" ")[0]: line.split(" ")[1:] for line in done.stdout.splitlines() if line.startswith("RUN")}
    assert made_at_home in seen["RUNS"], seen  # the project's instance, not an empty one
    assert seen["RUN"][0] in runs_at_home()  # and what it recorded went there too
    assert list(elsewhere.iterdir()) == [], sorted(p.name for p in elsewhere.rglob("*"))[:10]
    assert (home / ".dagster" / "storage").is_dir()


def test_a_relative_instance_path_without_dagster_home_is_a_named_error(tmp_path):
    from fear_assets.defs.instance import DagsterHomeError, under_dagster_home

    assert under_dagster_home(".dagster/storage", {"DAGSTER_HOME": str(tmp_path)}) == str(tmp_path / ".dagster/storage")
    assert under_dagster_home("/abs/storage", {}) == "/abs/storage"
    with pytest.raises(DagsterHomeError, match="DAGSTER_HOME, which is not set. Fix: set DAGSTER_HOME"):
        under_dagster_home(".dagster/storage", {})
