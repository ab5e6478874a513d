"""The issue's test of the automation: "with automation on, materialising the family's stimuli
leads, with the daemon, to the pilot stage without another launch".

A real ``dagster-daemon`` on a temporary instance (the project's ``dagster.yaml`` with its paths
in a temporary directory) loads only the project's code location with a site configuration
that turns automation on. The test materialises the embedded family's stimuli (the frame bank
and the family's name gate) and nothing else; the automation sensor must then submit a run of a
pilot-stage asset of that family by itself. The test instance starts no run it queues
(``concurrency.runs.max_concurrent_runs: 0``): what is asserted is the daemon's launch, not the
pilot's computation (the main job's tests cover that), and nothing a model step writes
is left behind.
"""

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.storage.tags import AUTOMATION_CONDITION_TAG, PARTITION_NAME_TAG

from fear_assets.core.site import SITE_ENV
from fear_assets.defs.automation import LAUNCHED_BY_TAG, SENSOR_NAME
from fear_assets.defs.definitions import build_definitions
from fear_assets.defs.resources.store import DUCKDB_ENV

from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.processes import stop_group, wait_while_alive

ROOT = Path(__file__).resolve().parents[1]
#: The daemon loads the code location (a code server) before its first evaluation.
FIRST_TICK_S = 240
#: What the daemon logs once the sensor's first evaluation requested nothing.
FIRST_TICK = (f"Sensor {SENSOR_NAME} skipped", f"No run requests returned for {SENSOR_NAME}")
#: One sensor interval (30 s) and the run's submission, on a loaded host.
LAUNCH_S = 180


def _instance_yaml(home: Path) -> str:
    cfg = yaml.safe_load((ROOT / "dagster.yaml").read_text(encoding="utf-8"))
    for section in (cfg["storage"]["custom"], cfg["local_artifact_storage"], cfg["compute_logs"]):
        section["config"]["base_dir"] = str(home / section["config"]["base_dir"])
    cfg.setdefault("concurrency", {})["runs"] = {"max_concurrent_runs": 0}  # queued, never started
    return yaml.safe_dump(cfg, sort_keys=False)


@contextmanager
def _daemon(workspace: Path, env: dict, log_path: Path):
    with open(log_path, "w") as log:
        # its own process group: the code server it spawns stops with it
        daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
                                  cwd=workspace.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        yield daemon
    finally:
        stop_group(daemon)


def test_with_automation_on_the_familys_stimuli_lead_the_daemon_to_its_pilot(tmp_path, monkeypatch):
    home, db = tmp_path / "home", tmp_path / "store.duckdb"
    home.mkdir()
    (home / "dagster.yaml").write_text(_instance_yaml(home), encoding="utf-8")
    (tmp_path / "site.yaml").write_text("automation: true\n", encoding="utf-8")
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - python_module:\n      module_name: fear_assets.defs.definitions\n"
                         f"      working_directory: {ROOT}\n      location_name: two_facts_one_gate\n")
    env = {"DAGSTER_HOME": str(home), SITE_ENV: str(tmp_path / "site.yaml"), DUCKDB_ENV: str(db),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.from_config(str(home))
    log = tmp_path / "daemon.log"
    with _daemon(workspace, {**os.environ, **env}, log) as daemon:
        # The first evaluation sees nothing materialised: the stimuli below are what it reacts to.
        wait_while_alive("the automation sensor's first tick", lambda: any(t in log.read_text() for t in FIRST_TICK), FIRST_TICK_S, daemon, log, poll=1.0)
        assert not instance.get_runs()
        stimuli = build_definitions(str(db))  # this process: no automation, only the launch a lab makes
        started = time.time()
        frame_bank = stimuli.resolve_job_def("stimuli_unpartitioned_job").execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("frame_bank")])
        name_gate = stimuli.resolve_job_def("stimuli_by_family_job").execute_in_process(
            instance=instance, partition_key=EMBEDDED, asset_selection=[dg.AssetKey("name_gate")])
        assert frame_bank.success and name_gate.success
        ours = {frame_bank.run_id, name_gate.run_id}
        graph = stimuli.resolve_asset_graph()

        def launched():
            return [r for r in instance.get_runs(filters=dg.RunsFilter(tags={AUTOMATION_CONDITION_TAG: "true"}))
                    if r.run_id not in ours]

        def pilot_runs():
            # one tick submits its runs one by one: wait for the family's first steps of both
            # partitionings, the manifest (the stage's entry, no upstream asset) and the trial tables
            runs = [r for r in launched() if EMBEDDED in r.tags.get(PARTITION_NAME_TAG, "")
                    and any(graph.get(k).group_name == "pilot" for k in (r.asset_selection or ()))]
            selected = {k.to_user_string() for r in runs for k in (r.asset_selection or ())}
            return runs if {"model_manifest", "pilot_trial_table", "assignment_key"} <= selected else None

        runs = wait_while_alive("runs of the pilot launched by the automation", pilot_runs, LAUNCH_S, daemon, log, poll=1.0)
    for run in runs:
        assert run.tags.get(LAUNCHED_BY_TAG) == "automation"
        assert instance.get_run_record_by_id(run.run_id).create_timestamp.timestamp() >= started
    # every run the daemon submitted is a pilot run of the family whose stimuli were materialised
    others = [r for r in instance.get_runs() if r.run_id not in ours]
    assert all(EMBEDDED in r.tags.get(PARTITION_NAME_TAG, "") for r in others)
    assert all(graph.get(k).group_name == "pilot" for r in others for k in (r.asset_selection or ()))
