"""Stopping what a test started, children included."""

from __future__ import annotations

import os
import signal
import subprocess


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
