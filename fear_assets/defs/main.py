"""The main job on the embedded family: ``python -m fear_assets.defs.main [duckdb path]``
(``fear demo``), and the stage loop ``fear run`` shares with it.

Runs the stage jobs (``definitions.stage_jobs``: one per stage and partitioning, selected by
asset group) in the protocol's stage order through the project's Dagster instance, so the
runs, partitions and checks show in the UI. The order of steps inside a stage is read from
the asset graph (a step waits for its inputs of another partitioning), not kept here. The
summary is printed from the assets' materialisation metadata; library warnings go to the
run log beside the store, not to the console.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fear_assets.defs.console import WARNINGS, capture_warnings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fear_assets.defs.main",
                                description="The main job: every stage of the embedded family through the project's "
                                            "Dagster instance, then the summary (the same as `fear demo`).")
    p.add_argument("duckdb_path", nargs="?", default=None,
                   help="the DuckDB store (default: $FEAR_ASSETS_DUCKDB, else data/fear_assets.duckdb)")
    return p


if __name__ == "__main__":  # before the imports below: --help answers at once, and their warnings are captured
    ARGS = parser().parse_args()
    capture_warnings()

import dagster as dg  # noqa: E402 (after the warning capture above)

from fear_assets.defs.automation import failure_text  # noqa: E402
from fear_assets.defs.definitions import STAGE_NAMES, build_definitions, partitioning_of  # noqa: E402
from fear_assets.defs.instance import check_evaluations  # noqa: E402
from fear_assets.defs.orphans import HOST_TAG, PID_TAG, report_orphans, wait_for_slots  # noqa: E402
from fear_assets.defs.partitions import power_partition_keys, registered_partition_keys  # noqa: E402
from fear_assets.defs.resources.protocol import ProtocolResource  # noqa: E402
from fear_assets.defs.resources.store import duckdb_path as default_duckdb_path  # noqa: E402
from fear_assets.core.settings import PROJECT_ROOT  # noqa: E402
from fear_assets.registration.issue import CONFIRMATORY, family_mode  # noqa: E402
from fear_assets.registration.record import analysis_code_sha256  # noqa: E402

#: The console shows INFO and above (progress of long steps), not Dagster's DEBUG events;
#: everything is still in the instance's event log and the UI.
QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
#: The family a run's steps belong to (the process tags PID_TAG, HOST_TAG: ``defs.orphans``).
FAMILY_TAG = "fear/family"
#: The registered inputs a run was built from (``inputs_tags``).
CODE_TAG, SETTINGS_TAG, BANK_TAG = "fear/code_sha256", "fear/settings_sha256", "fear/bank_sha256"
#: A file each step's figures are appended to as JSON lines (stage, assets, partition, seconds,
#: peak resident memory, run id), where set: ``fear rehearse`` measures every step from it.
STEP_LOG_ENV = "FEAR_STEP_LOG"
#: The error Dagster fails a step with when one of its blocking checks fails.
CHECK_FAILED = "DagsterAssetCheckFailedError"


@dataclass(frozen=True)
class Step:
    stage: str
    partitioning: str
    keys: tuple  # asset keys run together, per partition key


#: Steps of one level run in this order (a family's registered depths after the family step).
PARTITIONINGS = ("unpartitioned", "by_family", "by_depth", "by_batch")
#: What the main job is for: the reading and the cross-family statement (assets no reading
#: depends on, such as the name-amendment proposals, are materialised on request only).
TARGETS = ("trial_accounting", "section8_reading", "cross_family_statement", "stage2_report", "data_record",
           "stage2_report_all")


def plan(defs, stages) -> list[Step]:
    """Steps in stage order; inside a stage, an asset joins the step of its inputs of the same
    partitioning and waits one step for an input of another partitioning."""
    graph = defs.resolve_asset_graph()
    part = {k: partitioning_of(a) for a in defs.assets for k in a.keys}
    needed = set(dg.AssetSelection.assets(*TARGETS).upstream().resolve(graph))
    steps: list[Step] = []
    for stage in stages:
        level: dict = {}
        for k in graph.toposorted_asset_keys:
            if graph.get(k).group_name != stage or k not in needed:
                continue
            level[k] = max([level[p] + (part[p] != part[k]) for p in graph.get(k).parent_keys if p in level],
                           default=0)
        for lv, partitioning in sorted({(v, part[k]) for k, v in level.items()},
                                       key=lambda x: (x[0], PARTITIONINGS.index(x[1]))):
            steps.append(Step(stage, partitioning,
                              tuple(k for k, v in level.items() if v == lv and part[k] == partitioning)))
    return steps


def _metadata(instance, key: str, partition: str | None = None) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(key)) if partition is None else next(
        iter(instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(key),
                                                                   asset_partitions=[partition]), limit=1).records), None)
    materialization = (event.asset_materialization if partition is None else
                       event.event_log_entry.asset_materialization) if event else None
    return {k: v.value for k, v in materialization.metadata.items()} if materialization else {}


def family_partition_keys(settings, family: str) -> dict[str, list]:
    """The partition keys of each partitioning that a family's registered design materialises."""
    return {"unpartitioned": [None], "by_family": [family],
            "by_depth": registered_partition_keys(settings, family),
            "by_batch": power_partition_keys(settings, family)}


def family_is_confirmatory(family: str, registration_dir: str | Path | None = None) -> bool:
    """Whether a failed registration gate (ERROR severity) stops the family's run: once its
    registration record is issued (``registration.issue.family_mode``; default directory: the
    protocol resource's)."""
    directory = ProtocolResource().registration_dir if registration_dir is None else registration_dir
    return family_mode(directory, family) == CONFIRMATORY


@dataclass(frozen=True)
class Stop:
    """Why the stage loop stopped: a failed step (``check`` None) or a failed blocking gate."""

    stage: str
    step: str
    partition: object  # the partition key (None: unpartitioned)
    check: str | None
    message: str
    what_to_do: str = ""


def _what_to_do(evaluation) -> str:
    value = evaluation.metadata.get("what to do")
    return str(value.value) if value is not None else ""


def inputs_tags(protocol: ProtocolResource) -> dict[str, str]:
    """The registered inputs a run is built from, as run tags: a later ``fear run`` keeps a
    partition only if it was built from the same code, settings and bank."""
    return {CODE_TAG: analysis_code_sha256(), SETTINGS_TAG: protocol.settings().sha256, BANK_TAG: protocol.bank().sha256}


def latest_evaluation(instance, check_key, partition: str | None):
    """The newest completed evaluation of ``check_key`` on ``partition`` (None: never run)."""
    return next((e for p, e in check_evaluations(instance, check_key) if p == partition), None)


def kept_partitions(defs, instance, family: str, inputs: dict[str, str]):
    """``fear run``'s ``kept``: a step's partition is kept when every one of its assets was
    materialised there by a run built from the same inputs (``inputs_tags``); a gate that
    failed there and blocks (the freeze gate; any ERROR gate of a confirmatory family) stops."""
    specs: dict = {}
    for d in (*defs.assets, *defs.asset_checks):
        for spec in d.check_specs:
            specs.setdefault(spec.key.asset_key, []).append(spec)
    confirmatory = family_is_confirmatory(family)

    def built_from_inputs(asset_key, key) -> bool:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=None if key is None else [str(key)]),
            limit=1).records
        run = instance.get_run_by_id(records[0].run_id) if records else None
        return run is not None and all(run.tags.get(k) == v for k, v in inputs.items())

    def kept(step, key):
        if not all(built_from_inputs(k, key) for k in step.keys):
            return False
        for asset_key in step.keys:
            for spec in specs.get(asset_key, []):
                e = latest_evaluation(instance, spec.key, None if key is None else str(key))
                if e is not None and not e.passed and (
                        spec.key.name == "bank_freeze" or confirmatory and e.severity == dg.AssetCheckSeverity.ERROR):
                    return Stop(step.stage, ", ".join(k.to_user_string() for k in step.keys), key, spec.key.name,
                                f"(failed in an earlier run) {e.description or ''}", _what_to_do(e))
        return True
    return kept


def reset_peak_memory() -> None:
    """Start a new peak of this process's resident memory (Linux: ``clear_refs`` 5 resets VmHWM),
    so that :func:`peak_memory_mib` after a step is that step's own peak."""
    clear = Path("/proc/self/clear_refs")
    if clear.exists():
        try:
            clear.write_text("5")
        except OSError:  # a kernel or sandbox that refuses it: the peak is then the process's so far
            return


def peak_memory_mib() -> float | None:
    """This process's peak resident memory since :func:`reset_peak_memory` (Linux VmHWM), MiB;
    None where /proc does not say."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def log_step(record: dict) -> None:
    """Append one step's figures to ``$FEAR_STEP_LOG`` (nothing where it is unset)."""
    path = os.environ.get(STEP_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")


def run_stages(defs, instance, settings, family: str, stages, kept=None, tags=None) -> Stop | None:
    """Each step of ``stages`` for ``family``, in the protocol's order, through ``instance``;
    prints one line per step and partition. Returns the first failed step or failed blocking
    gate (the freeze gate always; any ERROR-severity gate of a confirmatory family), else None.

    ``kept(step, key)`` (``fear run``; the demo runs everything): True keeps a partition that
    an earlier run finished, a :class:`Stop` stops at a gate that failed there earlier (a check
    blocks only inside its own run). It is asked only until a step has run: what follows a
    rerun step is rerun, since its inputs changed.

    Before each step it clears the runs that cannot be working but hold pool slots (killed
    mid-step: the step would wait for them for ever), names those that might still be
    (``defs.orphans``), and waits itself for a slot another run holds, saying so (Ctrl-C stops
    it there; Dagster's executor would defer it until it had the slot)."""
    partition_keys = family_partition_keys(settings, family)
    graph = defs.resolve_asset_graph()
    tags = {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), FAMILY_TAG: family, **(tags or {})}
    resuming = kept is not None
    for step in plan(defs, stages):
        job = defs.resolve_job_def(f"{step.stage}_{step.partitioning}_job")
        names = ", ".join(k.to_user_string() for k in step.keys)
        pools = {graph.assets_def_for_key(k).op.pool for k in step.keys}
        ran = False
        for key in partition_keys[step.partitioning]:
            label = f"[{step.stage}] {names}" + (f" {key}" if key is not None else "")
            earlier = kept(step, key) if resuming else None
            if isinstance(earlier, Stop):
                return earlier
            if earlier:
                print(f"  {label[:90]:<90} kept (finished in an earlier run)")
                continue
            ran = True
            # A run killed mid-step keeps its pool slot, and this step would wait for it for ever.
            report_orphans(instance)
            wait_for_slots(instance, pools, lambda line, label=label: print(f"  {label[:90]}: {line}"))
            reset_peak_memory()
            t = time.perf_counter()
            result = job.execute_in_process(instance=instance, partition_key=key, asset_selection=list(step.keys),
                                            raise_on_error=False, run_config=QUIET, tags=tags)
            log_step({"stage": step.stage, "assets": [k.to_user_string() for k in step.keys],
                      "partition": None if key is None else str(key), "seconds": round(time.perf_counter() - t, 2),
                      "peak_rss_mib": peak_memory_mib(), "run_id": result.run_id, "success": result.success})
            failures = [e for e in result.all_events if e.is_step_failure]
            # a failed blocking check also fails its step; that is the gate's stop, reported below
            gate_failures = [e for e in failures if e.event_specific_data.error.cls_name == CHECK_FAILED]
            if len(failures) > len(gate_failures):  # a real failure, not a failed gate
                return Stop(step.stage, names, key, None,
                            failure_text(next(e for e in failures if e not in gate_failures).event_specific_data.error))
            failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
            print(f"  {label[:90]:<90} {time.perf_counter() - t:6.1f} s  run {result.run_id[:8]}"
                  + (f"  FAILED CHECKS: {', '.join(e.check_name for e in failed)}" if failed else ""))
            for e in failed:
                print(f"    {e.check_name}: {e.description}")
            errors = [e for e in failed if e.severity == dg.AssetCheckSeverity.ERROR]
            blocking = [e for e in failed if e.check_name == "bank_freeze"] or (
                errors if gate_failures or family_is_confirmatory(family) else [])
            if blocking:
                return Stop(step.stage, names, key, blocking[0].check_name, blocking[0].description or "",
                            _what_to_do(blocking[0]))
        resuming = resuming and not ran
    return None


def prepare(duckdb_path: str | None = None) -> tuple[str, Path]:
    """The store and the run log of a command that runs steps (the instance is ``$DAGSTER_HOME``,
    default the project root); library warnings go to the log from now on."""
    sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as steps finish
    os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT))
    os.chdir(PROJECT_ROOT)  # dagster.yaml keeps the instance under ./.dagster
    db = duckdb_path or default_duckdb_path()
    log_path = Path(db).with_suffix(".main.log")
    handler = logging.FileHandler(log_path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    WARNINGS.setTarget(handler)
    WARNINGS.flush()
    WARNINGS.flushLevel = logging.WARNING  # from now on every warning is written as it comes
    return db, log_path


def run(duckdb_path: str | None = None) -> int:
    db, log_path = prepare(duckdb_path)
    defs = build_definitions(db)
    instance = dg.DagsterInstance.get()
    settings = ProtocolResource().settings()
    family = next(k for k, f in settings.families.items() if f.role == "embedded")
    spec = settings.family(family)
    started = time.perf_counter()
    print(f"fear_assets main job: family {family} ({spec.tested})")
    if spec.reduced_design:
        rd = spec.reduced_design
        print(f"  REDUCED DESIGN: {rd.reason}")
        thinned = "".join(f" ({d} at name rotation {', '.join(map(str, r))} only)" for d, r in rd.rotations_by_depth.items())
        print(f"  depths {dict(zip(spec.depth_keys, spec.depth_tokens))} tokens{thinned}; pilot frames "
              f"{', '.join(rd.pilot_frames or ('the registered set',))}; {rd.confirmatory_frames_per_fear} "
              f"confirmatory frame(s) per fear; scored blocks {', '.join(rd.scored_blocks or ('every block',))}")
        print("  The confirmatory stage reuses this reduced design: it scores no confirmatory block, so the "
              "analysis reads the pilot's scores (descriptive) and costs no second round of scoring.")
    print(f"  stages: {' -> '.join(STAGE_NAMES)}; library warnings: {log_path}")
    stop = run_stages(defs, instance, settings, family, STAGE_NAMES, tags=inputs_tags(ProtocolResource()))
    if stop is not None and stop.check is None:
        raise SystemExit(f"step failed in {stop.step} {stop.partition}: {stop.message}")
    if stop is not None and stop.check == "bank_freeze":
        print("The freeze gate failed: nothing downstream runs. See the check's message above.")
        return 2
    if stop is not None:
        print(f"Confirmatory mode: a registration gate failed in {stop.step}; nothing downstream runs.")
        return 2
    return summary(instance, settings, family, db, log_path, time.perf_counter() - started)


def _table(markdown: str) -> str:
    return "\n".join("    " + line for line in str(markdown).splitlines())


def summary(instance, settings, family: str, db: str, log_path: Path, elapsed: float) -> int:
    """The console summary, from the assets' materialisation metadata."""
    accounting = _metadata(instance, "trial_accounting", family)
    record = _metadata(instance, "registration_record", family)
    h4 = _metadata(instance, "h4_posterior", family)
    estimands = _metadata(instance, "posteriors", family)
    reading = _metadata(instance, "section8_reading", family)
    power = _metadata(instance, "power_summary", family)
    ok = int(accounting.get("blocks off formula", 1)) == 0
    print(f"\nDone in {elapsed:.0f} s: {accounting.get('trials')} trials ({accounting.get('pilot trials')} pilot, "
          f"{accounting.get('confirmatory trials')} confirmatory) for {family}; "
          f"accounting {'closed' if ok else 'NOT closed'}.")
    print(f"Registration record ({record.get('status')}): {record.get('record')}")
    print(_table(record.get("gates", "")))
    print("H4 (carriage, probe log-odds, 99% HDI):")
    print(_table(h4.get("H4", "")))
    print(f"Estimands, gates and controls (99% HDI; frame set: {estimands.get('frame set')}):")
    print(_table(estimands.get("estimands", "")))
    print(f"\nSECTION 8 READING for {family}: {reading.get('reading')}")
    print(f"  labels: {reading.get('labels')}")
    print(f"  qualifiers: {reading.get('qualifiers')}")
    print(f"  flags: {reading.get('flags')}")
    if power:
        print(f"POWER GATE (6.3) for {family}: status {power.get('status')}; frames {power.get('frames')}; "
              f"demo (not registered): {power.get('demo (not registered)')}; "
              f"estimation-only {power.get('estimation-only')}")
    report = _metadata(instance, "stage2_report", family)
    if report:
        print(f"Stage 2 report (Appendix C step 7): {report.get('report')} ({report.get('deviations')} deviations)")
    print(f"DuckDB file: {db}; library warnings: {log_path}")
    print(f"  inspect:  .venv/bin/python -c \"import duckdb; print(duckdb.connect('{db}', read_only=True)"
          ".sql('select block, count(*) from two_facts_one_gate.pilot_trial_table group by 1'))\"")
    print("Dagster UI (asset graph by stage, partitions, checks, run history):")
    print(f"  cd {PROJECT_ROOT} && bash scripts/fear ui   # then open http://127.0.0.1:3000")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(ARGS.duckdb_path))
