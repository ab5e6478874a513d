"""The ``fear`` commands (``fear_assets.defs.cli`` checks the arguments and runs this module).

``run`` shares the main job's stage loop (``main.run_stages``) and ``status`` reads what the
instance recorded: each asset's materialised partitions against those the family's registered
design expects, and each check's latest evaluation on them. Runs left in progress by a worker
that is gone (killed, host rebooted) keep their pool slots, so every later model step waits
"blocked by limit for pool gpu": ``status`` lists them, ``cancel`` clears one, and every stage
loop clears those that provably cannot be working (``defs.orphans``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fear_assets.defs.cli import REGISTER_ARGS, check_family, parser
from fear_assets.defs.console import capture_warnings

if __name__ == "__main__":  # before the imports below, whose warnings it captures
    capture_warnings()

import dagster as dg  # noqa: E402 (after the warning capture above)

from fear_assets.core.errors import FearAssetsError  # noqa: E402
from fear_assets.core.settings import PROJECT_ROOT  # noqa: E402
from fear_assets.core.site import load_site  # noqa: E402
from fear_assets.defs import main as main_job  # noqa: E402
from fear_assets.defs.definitions import STAGE_NAMES, build_definitions, partitioning_of  # noqa: E402
from fear_assets.defs.instance import apply_pools, check_evaluations  # noqa: E402
from fear_assets.defs.orphans import IN_PROGRESS, alive, free_run, orphaned_runs, worker_pid  # noqa: E402
from fear_assets.defs.resources.protocol import ProtocolResource  # noqa: E402
from fear_assets.defs.resources.store import duckdb_path as default_duckdb_path  # noqa: E402
from fear_assets.registration.issue import issue_record  # noqa: E402



def usage_error(message: str) -> int:
    print(f"fear: error: {message}", file=sys.stderr)
    return 2


# ---- fear run -------------------------------------------------------------------------------


def stages_through(through: str | None) -> tuple[str, ...] | None:
    """The stages up to ``through`` (all without it); None for a stage the protocol lacks."""
    if through is None:
        return STAGE_NAMES
    return STAGE_NAMES[:STAGE_NAMES.index(through) + 1] if through in STAGE_NAMES else None


def check_descriptions(defs) -> dict[str, str]:
    """Each check's registered meaning (its description in the definitions), by check name."""
    return {spec.key.name: spec.description or "" for d in (*defs.assets, *defs.asset_checks)
            for spec in d.check_specs}


def print_stop(stop: main_job.Stop, family: str, descriptions: dict[str, str]) -> None:
    where = stop.step if stop.partition is None else f"{stop.step} {stop.partition}"
    if stop.check is None:
        print(f"\nSTOPPED: a step failed in stage {stop.stage}: {where}")
        print(f"  error: {stop.message}")
        print(f"  what to do: fix the error above, then rerun `fear run {family} --through {stop.stage}` "
              "(finished partitions and chunks are kept)")
    else:
        print(f"\nSTOPPED at the blocking gate {stop.check} (stage {stop.stage}: {where}); "
              "nothing downstream of it runs.")
        print(f"  the gate: {descriptions.get(stop.check, '')}")
        print(f"  its result: {stop.message}")
        print(f"  what to do: {stop.what_to_do or 'change what the result names'}, then rerun "
              f"`fear run {family} --through {stop.stage}`")
    print(f"  where {family} stands: fear status {family}")


def run(args) -> int:
    stages = stages_through(args.through)
    if stages is None:
        return usage_error(f"argument --through: unknown stage {args.through!r} (choose from {', '.join(STAGE_NAMES)})")
    db, log_path = main_job.prepare()
    settings = ProtocolResource().settings()
    site = load_site(registered_checkpoints=settings.models)
    instance = dg.DagsterInstance.get()
    pools = apply_pools(instance, site)
    defs = build_definitions(db)
    print(f"fear run {args.family} ({settings.family(args.family).tested}), mode "
          f"{'confirmatory' if main_job.family_is_confirmatory(args.family) else 'pilot'}: "
          f"{' -> '.join(stages)}")
    print(f"  instance {os.environ['DAGSTER_HOME']}; store {db}; site {site.path or 'defaults'}"
          + (f"; pools {pools}" if pools else "") + f"; library warnings: {log_path}")
    inputs = main_job.inputs_tags(ProtocolResource())
    kept = None if args.rerun else main_job.kept_partitions(defs, instance, args.family, inputs)
    stop = main_job.run_stages(defs, instance, settings, args.family, stages, kept=kept, tags=inputs)
    if stop is not None:
        print_stop(stop, args.family, check_descriptions(defs))
        return 1 if stop.check is None else 2
    print(f"\n{args.family}: stages through {stages[-1]} materialised. Where it stands: fear status {args.family}")
    return 0


# ---- fear status ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AssetState:
    name: str
    materialised: int
    expected: int


@dataclass(frozen=True)
class CheckState:
    name: str
    asset: str
    state: str  # "passed" | "failed" | "not run" | "partly run"
    severity: str  # of the failed evaluation ("ERROR" | "WARN"), else ""
    result: str  # the latest failed evaluation's description, else ""
    description: str  # the check's registered meaning


@dataclass(frozen=True)
class StageState:
    name: str
    assets: tuple[AssetState, ...]
    checks: tuple[CheckState, ...]

    @property
    def state(self) -> str:
        done = sum(a.materialised for a in self.assets)
        if done == 0:
            return "not run"
        return "done" if all(a.materialised == a.expected for a in self.assets) else "partly run"


def _key_str(key) -> str | None:
    return None if key is None else str(key)


def _materialised(instance, asset_key: dg.AssetKey, expected: list) -> int:
    if expected == [None]:
        return int(instance.get_latest_materialization_event(asset_key) is not None)
    done = instance.get_materialized_partitions(asset_key)
    return sum(str(k) in done for k in expected)


def _check_state(instance, spec, expected: list, description: str) -> CheckState:
    wanted = {_key_str(k) for k in expected}
    latest: dict = {}
    for partition, evaluation in check_evaluations(instance, spec.key):  # newest first: the latest per partition
        if partition in wanted and partition not in latest:
            latest[partition] = evaluation
    failed = [e for e in latest.values() if not e.passed]
    if failed:
        state = "failed"
    elif not latest:
        state = "not run"
    else:
        state = "passed" if len(latest) == len(wanted) else "partly run"
    worst = next((e for e in failed if e.severity == dg.AssetCheckSeverity.ERROR), failed[0] if failed else None)
    return CheckState(spec.key.name, spec.key.asset_key.to_user_string(), state,
                      worst.severity.value if worst else "", (worst.description or "") if worst else "", description)


def stage_states(defs, instance, settings, family: str) -> list[StageState]:
    """What the instance recorded for each stage of ``family`` (the assets the stage loop runs)."""
    keys = main_job.family_partition_keys(settings, family)
    part = {k: partitioning_of(a) for a in defs.assets for k in a.keys}
    specs = [spec for d in (*defs.assets, *defs.asset_checks) for spec in d.check_specs]
    descriptions = check_descriptions(defs)
    by_stage: dict[str, list] = {stage: [] for stage in STAGE_NAMES}
    for step in main_job.plan(defs, STAGE_NAMES):
        by_stage[step.stage].extend(step.keys)
    states = []
    for stage, asset_keys in by_stage.items():
        assets = tuple(AssetState(k.to_user_string(), _materialised(instance, k, keys[part[k]]), len(keys[part[k]]))
                       for k in asset_keys)
        checks = tuple(_check_state(instance, s, keys[part[s.key.asset_key]], descriptions[s.key.name])
                       for s in specs if s.key.asset_key in asset_keys)
        states.append(StageState(stage, assets, checks))
    return states


def blocks(check: CheckState, confirmatory: bool) -> bool:
    """A failed gate that stops the family: the freeze gate always, any ERROR gate once confirmatory
    (the stage loop's rule, ``main.run_stages``)."""
    return check.state == "failed" and (check.name == "bank_freeze" or (confirmatory and check.severity == "ERROR"))


def next_action(states: list[StageState], family: str, confirmatory: bool) -> str:
    """The one thing to do next: fix a gate that blocks, run the first stage not done, or (a
    pilot family whose pilot and power gates passed) issue its registration record."""
    before_registration = True
    for stage in states:
        stop = next((c for c in stage.checks if blocks(c, confirmatory)), None)
        if stop is not None:
            return f"fix the failed gate: {stop.name} — {stop.description}"
        if stage.state != "done":
            return f"run: fear run {family} --through {stage.name}"
        if stage.name == "registration" and not confirmatory and before_registration:
            gates = [c for s in states[:states.index(stage) + 1] for c in s.checks
                     if c.state == "failed" and c.severity == "ERROR"]
            if gates:
                return (f"fix the failed gate: {gates[0].name} — {gates[0].description} "
                        "(registration needs the pilot and power gates passed)")
            return f"register: fear register {family} {REGISTER_ARGS}"
    return f"none: every stage of {family} is materialised (the Stage 2 report: the reading stage's stage2_report)"


def status(args) -> int:
    os.chdir(PROJECT_ROOT)  # dagster.yaml keeps the instance under $DAGSTER_HOME/.dagster
    settings = ProtocolResource().settings()
    instance = dg.DagsterInstance.get()
    defs = build_definitions(default_duckdb_path())  # the asset graph only: the store is not opened
    confirmatory = main_job.family_is_confirmatory(args.family)
    states = stage_states(defs, instance, settings, args.family)
    print(f"{args.family} ({settings.family(args.family).tested}): mode {'confirmatory' if confirmatory else 'pilot'}"
          f"; instance {os.environ.get('DAGSTER_HOME')}")
    for stage in states:
        print(f"\n[{stage.name}] {stage.state}" + ("" if stage.state == "done" else
                                                  f"  (run: fear run {args.family} --through {stage.name})"))
        for a in stage.assets:
            print(f"  asset {a.name:<34} {a.materialised}/{a.expected} partitions")
        for c in stage.checks:
            line = f"  check {c.name:<34} {c.state}"
            if c.state == "failed":
                line += f" ({c.severity}{', blocks' if blocks(c, confirmatory) else ''}): {c.result}"
            print(line)
    print(f"\nnext: {next_action(states, args.family, confirmatory)}")
    orphans = orphaned_runs(instance)
    if orphans:
        print("\nRuns left in progress or holding pool slots (every later step waiting on the pool waits for them):")
        for o in orphans:
            print(f"  {o.run_id} {o.job} {o.status}: {o.why}. Clear it: fear cancel {o.run_id}")
    return 0


# ---- fear cancel, register, demo, ui --------------------------------------------------------


def cancel(args) -> int:
    instance = dg.DagsterInstance.get()
    run = instance.get_run_by_id(args.run_id)
    if run is None:
        return usage_error(f"no run {args.run_id!r} in the instance at {os.environ.get('DAGSTER_HOME')}: "
                           "copy its id from `fear status FAMILY` or the UI's Runs page")
    pid = worker_pid(instance, run)
    if run.status in IN_PROGRESS and pid is not None and alive(pid) and not args.force:
        print(f"fear cancel: run {run.run_id} is {run.status.value} and its process {pid} is alive: stop it in the "
              "UI (Runs, Terminate), or pass --force to mark it canceled anyway", file=sys.stderr)
        return 1
    held = free_run(instance, run.run_id, "Marked canceled by `fear cancel`: its worker is gone.")
    after = instance.get_run_by_id(run.run_id)
    print(f"run {run.run_id} ({run.job_name}): {run.status.value} -> {after.status.value}; freed slots: "
          f"{', '.join(held) or 'none held'}")
    return 0


def refresh_stored_record(family: str) -> str:
    """Materialise ``registration_record`` for ``family`` once more, so the store and the UI
    show the issued record (a rerun on the same inputs keeps its issue) and, with automation
    on, the registered family's collection sees the update it waits for."""
    db, _ = main_job.prepare()
    defs = build_definitions(db)
    job = defs.resolve_job_def("registration_by_family_job")
    result = job.execute_in_process(instance=dg.DagsterInstance.get(), partition_key=family,
                                    asset_selection=[dg.AssetKey("registration_record")], raise_on_error=False,
                                    run_config=main_job.QUIET, tags={main_job.FAMILY_TAG: family})
    if result.success:
        return f"the stored registration_record now shows the issued record (run {result.run_id[:8]})"
    failure = next((e for e in result.all_events if e.is_step_failure), None)
    why = failure.event_specific_data.error.message.strip().splitlines()[0] if failure else "the run did not succeed"
    return (f"the stored registration_record still shows the draft ({why}); materialise registration_record for "
            f"{family} again in the UI before the collection")


def register(args) -> int:
    protocol = ProtocolResource()
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    note = Path(args.supplementary_note).expanduser().resolve()
    try:
        path = issue_record(Path(protocol.registration_dir), args.family, args.stage1_id, note, now)
    except FearAssetsError as exc:
        print(f"fear register: {exc}", file=sys.stderr)
        return 1
    print(f"Issued the registration record of {args.family}: {path}")
    print(f"  Stage 1 {args.stage1_id}, issued {now}, supplementary note {note}")
    print("  " + refresh_stored_record(args.family))
    print(f"  {args.family} is now confirmatory: its registration gates block (a failed gate stops "
          f"`fear run {args.family}`), and its analysis unmasks only once scoring is locked. Other families keep "
          "their own mode.")
    print(f"next: fear run {args.family}")
    return 0


def demo(args) -> int:
    return main_job.run(None)


def ui(args) -> int:
    os.chdir(PROJECT_ROOT)
    settings = ProtocolResource().settings()
    pools = apply_pools(dg.DagsterInstance.get(), load_site(registered_checkpoints=settings.models))
    dagster = str(Path(sys.executable).parent / "dagster")
    argv = [dagster, "dev", "-w", str(PROJECT_ROOT / "workspace.yaml")]
    argv += ["--port", str(args.port)] if args.port else []
    argv += ["--host", args.host] if args.host else []
    print(f"dagster dev on the instance {os.environ.get('DAGSTER_HOME')}" + (f"; pools {pools}" if pools else ""))
    os.execv(dagster, argv)
    return 0  # not reached


COMMANDS = {"demo": demo, "run": run, "status": status, "cancel": cancel, "register": register, "ui": ui}


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_family(p, args, ProtocolResource().settings().families)
    os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT))
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:  # reached between steps (a step itself stops through Dagster)
        print(f"\nfear {args.command}: stopped by Ctrl-C between steps; what the finished steps stored is kept,"
              f" and `fear {args.command}` again goes on from there.", file=sys.stderr)
        return 130  # the shell's code for a stop by SIGINT


if __name__ == "__main__":
    sys.exit(main())
