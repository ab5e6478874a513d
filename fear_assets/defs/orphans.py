"""Runs whose worker is gone, and the pool slots they still hold.

A run executed in process (``fear run``, the main job) claims a pool slot for each step. When
its process dies mid-step (kill -9, out of memory, a host reboot) nothing ends the run: it stays
STARTED and keeps the slot, and every later step of that pool waits for it, silently, for ever.
Dagster's daemon frees such slots only for runs it monitors (runs the UI launched; dagster.yaml's
``run_monitoring``), never for in-process runs. So:

- ``fear status`` lists them (:func:`orphaned_runs`) and ``fear cancel`` clears one;
- every stage loop first clears the runs that are provably dead (:func:`clear_dead_runs`): started
  on this host by a process that no longer exists, or ended but still holding slots. A run on
  another host, or one whose process exists, is only reported: it may still be working.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

import dagster as dg

from fear_assets.core.site import POOLS

#: Run tags naming the process that executes a run in process: a run whose process is gone
#: (killed, host rebooted) is told from one still working.
PID_TAG, HOST_TAG = "fear/pid", "fear/host"
#: Run states that hold (or wait for) pool slots; one of them with its worker gone is orphaned.
IN_PROGRESS = (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.QUEUED,
               dg.DagsterRunStatus.CANCELING)
#: A run in progress with no event for this long is listed as possibly orphaned: every model
#: step logs its progress (``defs.progress``) far more often than this.
STALE_S = 3600.0


@dataclass(frozen=True)
class Orphan:
    run_id: str
    job: str
    status: str
    why: str
    #: True where the run cannot be working: its process on this host is gone, or it ended.
    dead: bool = False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_pid(run) -> int | None:
    """The pid ``fear run`` / the main job tagged ``run`` with, where it ran on this host."""
    if run.tags.get(HOST_TAG) == socket.gethostname() and run.tags.get(PID_TAG, "").isdigit():
        return int(run.tags[PID_TAG])
    return None


def worker_pid(instance, run) -> int | None:
    """The process executing ``run``: the tag ``fear run`` / ``fear demo`` set, else the run
    worker the code server started (its engine event)."""
    pid = local_pid(run)
    if pid is not None:
        return pid
    for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        if entry.message.startswith("Started process for run") and entry.dagster_event is not None:
            pid = entry.dagster_event.event_specific_data.metadata.get("pid")
            if pid is not None:
                return int(pid.value)
    return None


def held_slots(instance, run_id: str) -> list[str]:
    """The pools in which ``run_id`` holds a slot."""
    return [pool for pool in POOLS for slot in instance.event_log_storage.get_concurrency_info(pool).claimed_slots
            if slot.run_id == run_id]


def orphaned_runs(instance, now: float | None = None) -> list[Orphan]:
    """Runs in progress whose worker is gone or that logged nothing for ``STALE_S``, and runs
    that ended still holding pool slots."""
    now = time.time() if now is None else now
    orphans = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=list(IN_PROGRESS))):
        run = record.dagster_run
        pid = worker_pid(instance, run)
        last = instance.event_log_storage.get_records_for_run(run.run_id, ascending=False, limit=1).records
        since = now - (last[0].event_log_entry.timestamp if last else record.create_timestamp.timestamp())
        if pid is not None and not alive(pid):
            why, dead = f"its process {pid} is gone", local_pid(run) == pid
        elif since > STALE_S:
            why, dead = f"no event for {since / 60:.0f} min", False
        else:
            continue
        orphans.append(Orphan(run.run_id, run.job_name, run.status.value, why, dead))
    listed = {o.run_id for o in orphans}
    for pool in POOLS:
        for slot in instance.event_log_storage.get_concurrency_info(pool).claimed_slots:
            run = instance.get_run_by_id(slot.run_id)
            if slot.run_id in listed or (run is not None and run.status in IN_PROGRESS):
                continue
            listed.add(slot.run_id)
            orphans.append(Orphan(slot.run_id, run.job_name if run else "?", run.status.value if run else "unknown",
                                  f"it ended but still holds a slot of pool {pool!r}", True))
    return orphans


def free_run(instance, run_id: str, message: str) -> list[str]:
    """Mark ``run_id`` canceled where it is still in progress and free every pool slot it holds;
    returns those pools."""
    held = held_slots(instance, run_id)
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status in IN_PROGRESS:
        instance.report_run_canceled(run, message=message)
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return held


def clear_dead_runs(instance) -> tuple[list[tuple[Orphan, list[str]]], list[Orphan]]:
    """Clear every orphan that cannot be working (``Orphan.dead``): (each cleared one with the
    pools it freed, the orphans left because they might still be working)."""
    cleared, left = [], []
    for orphan in orphaned_runs(instance):
        if orphan.dead:
            cleared.append((orphan, free_run(instance, orphan.run_id,
                                             f"Marked canceled by a later run: {orphan.why}.")))
        else:
            left.append(orphan)
    return cleared, left


def cleared_line(orphan: Orphan, pools: list[str]) -> str:
    return (f"cleared run {orphan.run_id[:8]} ({orphan.job}, {orphan.status}): {orphan.why}; "
            f"freed its slots: {', '.join(pools) or 'none held'}")


def report_orphans(instance) -> None:
    """What a stage loop prints before a step: the dead runs it cleared, and the runs that may
    still hold a slot its steps will wait for."""
    cleared, left = clear_dead_runs(instance)
    for orphan, pools in cleared:
        print(f"  {cleared_line(orphan, pools)}")
    for orphan in left:
        pools = held_slots(instance, orphan.run_id)
        if pools:
            print(f"  WAITING RISK: run {orphan.run_id} ({orphan.job}) holds a slot of {', '.join(pools)} and "
                  f"{orphan.why}; steps of that pool wait for it. If its worker is gone: fear cancel {orphan.run_id}")


def waiting_for(instance, pools) -> list[str]:
    """One line per pool of ``pools`` whose every slot another run holds: the step about to run
    will wait (Dagster's in-process executor says nothing while it does), and for which runs."""
    lines = []
    for pool in sorted(p for p in pools if p):
        info = instance.event_log_storage.get_concurrency_info(pool)
        if info.slot_count and len(info.claimed_slots) >= info.slot_count:
            holders = []
            for slot in info.claimed_slots:
                run = instance.get_run_by_id(slot.run_id)
                holders.append(f"{slot.run_id[:8]} ({run.job_name if run else '?'}, step {slot.step_key})")
            lines.append(f"waiting for a slot of pool {pool!r} ({info.slot_count} in all), held by run "
                         f"{', '.join(holders)}; fear status shows whether its worker is alive")
    return lines


#: Seconds between two looks at a busy pool (a step takes minutes; a claim is one query).
POLL_S = 2.0


def wait_for_slots(instance, pools, say: Callable[[str], None], poll_s: float = POLL_S,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once every pool of ``pools`` has a free slot, saying once for which runs it waits
    and clearing a holder that dies meanwhile (:func:`clear_dead_runs`). Dagster's in-process
    executor, which would otherwise do the waiting, defers Ctrl-C and SIGTERM until it has the
    slot, so a run waiting there could be stopped only by SIGKILL; this loop runs outside it."""
    said: set[str] = set()
    while True:
        cleared, _ = clear_dead_runs(instance)
        for orphan, freed in cleared:
            say(cleared_line(orphan, freed))
        lines = waiting_for(instance, pools)
        if not lines:
            return
        for line in lines:
            if line not in said:
                say(line)
                said.add(line)
        sleep(poll_s)


__all__ = ["HOST_TAG", "IN_PROGRESS", "Orphan", "PID_TAG", "STALE_S", "alive", "clear_dead_runs", "free_run",
           "cleared_line", "held_slots", "local_pid", "orphaned_runs", "report_orphans", "wait_for_slots", "waiting_for",
           "worker_pid"]
