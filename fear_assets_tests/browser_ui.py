"""A Dagster UI on loopback over a small materialised store, for the browser test (issue 15).

``python -m fear_assets_tests.browser_ui DIR`` builds the store in DIR and serves the UI
(for looking at what the test sees); the test uses the same functions.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fear_assets.core.settings import DEFAULT_CACHE_DIR
from fear_assets_tests.processes import stop_group

ROOT = Path(__file__).resolve().parents[1]
FAMILY = "smollm2-135m"  # the embedded family: real tokenizers, no weights needed for these assets

INSTANCE_YAML = """storage:
  sqlite:
    base_dir: {home}/storage
compute_logs:
  module: dagster.core.storage.local_compute_log_manager
  class: LocalComputeLogManager
  config:
    base_dir: {home}/compute_logs
concurrency:
  pools:
    default_limit: 1
  runs:
    max_concurrent_runs: 2
telemetry:
  enabled: false
"""
WORKSPACE_YAML = """load_from:
  - python_module:
      module_name: fear_assets.defs.definitions
      location_name: two_facts_one_gate
      working_directory: {root}
"""


def environment(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DAGSTER_HOME=str(home), FEAR_ASSETS_DUCKDB=str(home / "store.duckdb"),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               DAGSTER_DISABLE_TELEMETRY="1")
    return env


def build_store(home: Path) -> dict[str, str]:
    """The instance and a small store: the bank, the embedded family's name gate (a failed
    gate: its names split under the registered tokenizers), one trial-table partition and
    the family's Stage 2 report (which says what is not materialised yet). Returns run ids."""
    home.mkdir(parents=True, exist_ok=True)
    # The project's model and tokenizer cache, seen from inside ``home``: the step outputs
    # (the Stage 2 report) land beside it, under ``home``, not in the project's data/ (where
    # another test or the demo may be writing at the same time).
    cache = home / "data" / "cache"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.symlink_to(DEFAULT_CACHE_DIR, target_is_directory=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML.format(home=home))
    (home / "workspace.yaml").write_text(WORKSPACE_YAML.format(root=ROOT))
    code = (
        "import json, sys, dagster as dg\n"
        "from fear_assets.defs.definitions import all_assets, all_checks, resources\n"
        "from fear_assets.defs.partitions import registered_partition_keys\n"
        "from fear_assets.defs.resources.protocol import ProtocolResource\n"
        "SETTINGS = ProtocolResource().settings()\n"
        "inst = dg.DagsterInstance.get()\n"
        f"res = resources(None, cache_dir={str(cache)!r})\n"
        "every = [*all_assets, *all_checks]\n"
        "runs = {}\n"
        "def go(sel, key=None):\n"
        "    r = dg.materialize(every, selection=sel, partition_key=key, instance=inst, resources=res)\n"
        "    runs[sel[0]] = r.run_id\n"
        "go(['frame_bank'])\n"
        f"go(['name_gate'], '{FAMILY}')\n"
        f"go(['pilot_trial_table', 'assignment_key'], registered_partition_keys(SETTINGS, '{FAMILY}')[0])\n"
        f"go(['stage2_report'], '{FAMILY}')\n"
        "print(json.dumps(runs))\n")
    out = subprocess.run([sys.executable, "-c", code], env=environment(home), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"building the browser test's store failed:\n{out.stderr[-4000:]}")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(home: Path, port: int, log: Path) -> subprocess.Popen:
    """``dagster dev`` (webserver and daemon, which launches backfills) on loopback."""
    dagster = Path(sys.executable).with_name("dagster")
    handle = open(log, "w")
    proc = subprocess.Popen([str(dagster), "dev", "-w", str(home / "workspace.yaml"), "-h", "127.0.0.1",
                             "-p", str(port)], env=environment(home), cwd=ROOT, stdout=handle,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    stop_ui(proc)
    raise RuntimeError(f"dagster dev did not answer on port {port} within 180 s; see {log}")


def stop_ui(proc: subprocess.Popen) -> None:
    """Stop the process group this module started (webserver, daemon, code server)."""
    stop_group(proc)

if __name__ == "__main__":
    home = Path(sys.argv[1]).resolve()
    print(build_store(home))
    port = int(sys.argv[2]) if len(sys.argv) > 2 else free_port()
    p = start_ui(home, port, home / "dagster_dev.log")
    print(f"http://127.0.0.1:{port}  (pid {p.pid}; Ctrl-C stops)")
    try:
        p.wait()
    except KeyboardInterrupt:
        stop_ui(p)
