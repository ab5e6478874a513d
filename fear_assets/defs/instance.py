"""The project's Dagster instance storage, with its paths taken from ``$DAGSTER_HOME``.

Dagster's own SQLite storage, artifact storage and compute-log manager open a relative
``base_dir`` from the current directory, and ``dagster.yaml``'s values are literal strings (a
``{env: ...}`` value replaces a whole path and cannot append ``.dagster/storage``). So Dagster
code started from another directory with ``DAGSTER_HOME`` set silently made an empty instance in
that directory (issue 27). These subclasses change one thing: a relative ``base_dir`` is taken
from ``$DAGSTER_HOME`` (where Dagster read ``dagster.yaml``), so every process (webserver,
daemon, code servers, run workers, scripts) opens the same ``.dagster/`` wherever it starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.root import LocalArtifactStorage
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

from fear_assets.core.site import SiteConfig


class DagsterHomeError(ValueError):
    """A relative instance path with no ``$DAGSTER_HOME`` to anchor it."""


def under_dagster_home(base_dir: str, environ: os._Environ | dict | None = None) -> str:
    """``base_dir`` as an absolute path: unchanged if absolute, else joined to ``$DAGSTER_HOME``."""
    if os.path.isabs(base_dir):
        return base_dir
    home = (os.environ if environ is None else environ).get("DAGSTER_HOME")
    if not home:
        raise DagsterHomeError(
            f"dagster.yaml: base_dir {base_dir!r} is relative to DAGSTER_HOME, which is not set. "
            "Fix: set DAGSTER_HOME to the project root (scripts/fear does), or write an absolute base_dir")
    return str(Path(home).expanduser().resolve() / base_dir)


class ProjectSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite run, event-log and schedule storage under ``$DAGSTER_HOME/<base_dir>``."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        return cls.from_local(inst_data=inst_data, base_dir=under_dagster_home(config_value["base_dir"]))


class ProjectArtifactStorage(LocalArtifactStorage):
    """Dagster's local artifact storage under ``$DAGSTER_HOME/<base_dir>``."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        return cls(inst_data=inst_data, **{**config_value, "base_dir": under_dagster_home(config_value["base_dir"])})


class ProjectComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute-log manager under ``$DAGSTER_HOME/<base_dir>``."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # type: ignore[override]
        return cls(inst_data=inst_data, **{**config_value, "base_dir": under_dagster_home(config_value["base_dir"])})


def apply_pools(instance, site: SiteConfig) -> dict[str, int]:
    """Set the instance's slots of every pool the site configuration names (a four-GPU host:
    ``pools: {gpu: 4}``); pools it does not name keep dagster.yaml's default limit."""
    for pool, slots in site.pools.items():
        instance.event_log_storage.set_concurrency_slots(pool, slots)
    return dict(site.pools)


#: Check evaluations that ran to a result (not planned, not in progress).
COMPLETED = {AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED}


def evaluated_partition(instance, record) -> str | None:
    """The partition a check evaluation ran on: Dagster records it on the evaluation only
    sometimes, and always as the run's partition tag."""
    if record.partition is not None:
        return record.partition
    run = instance.get_run_by_id(record.run_id) if record.run_id else None
    return run.tags.get("dagster/partition") if run is not None else None


def check_evaluations(instance, check_key, limit: int = 1000) -> list[tuple[str | None, object]]:
    """The completed evaluations of ``check_key`` (the latest ``limit``), newest first, each with
    the partition it ran on: what ``fear run``, ``fear status`` and the automation read."""
    history = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=limit, status=COMPLETED)
    return [(evaluated_partition(instance, r), r.event.dagster_event.event_specific_data)
            for r in sorted(history, key=lambda r: -r.id) if r.event is not None]
