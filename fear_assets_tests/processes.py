"""Stopping what a test started, children included."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop ``proc``'s process group (start it with ``start_new_session=True``).

    SIGTERM first, then SIGKILL to whatever is left: Dagster's code servers outlive the daemon or
    webserver that spawned them, and one whose storage has gone away (the test's Postgres stopped)
    can ignore SIGTERM and wait forever for a heartbeat shutdown that never completes.
    """
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def wait_while_alive(what: str, until, timeout: float, daemon: subprocess.Popen, log: Path, poll: float = 0.2):
    """``until()``'s first true value, polled every ``poll`` s; fails with the daemon's log if
    the daemon exits first or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        got = until()
        if got:
            return got
        if daemon.poll() is not None:
            raise AssertionError(f"dagster-daemon exited ({daemon.returncode}): {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s; daemon log: {log.read_text()[-3000:]}")
        time.sleep(poll)
