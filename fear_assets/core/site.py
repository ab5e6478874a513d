"""The site configuration: what one host sets, apart from what the protocol registers.

Where each registered checkpoint's files are on this host, the device, per-host throughput
knobs, the Dagster pools' slots, the store, and the opt-in automation. None of it is part of
the registered settings or their hash: a checkpoint's identity is pinned by the model
manifest (the sha256 of every weight, config and tokenizer file), so pointing a checkpoint at
another directory with the same files changes nothing registered, and a directory with other
files is what the manifest check blocks.

The file is YAML (example: ``deploy/site.example.yaml``); its path comes from
``$FEAR_ASSETS_SITE`` or the command line (``fear --site FILE``). Without one every field
takes its default (the embedded demo needs none). Relative paths are read from the site
file's directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from fear_assets.core import sections
from fear_assets.core.errors import InputError

#: The variable that names this host's site configuration.
SITE_ENV = "FEAR_ASSETS_SITE"
STORES = ("duckdb", "parquet")
#: The Dagster pools the project's steps use (dagster.yaml): models in "gpu", DuckDB writers
#: in "duckdb", power-simulation batches in "power".
POOLS = ("gpu", "duckdb", "power")


class SiteError(InputError):
    """The site configuration is malformed (names the file, the field and the fix)."""


@dataclass(frozen=True)
class StoreSite:
    """Where the asset tables live: the embedded DuckDB file, or a Parquet tree (several
    writers). ``None`` paths keep the project's defaults (data/fear_assets.duckdb, data/parquet)."""

    kind: str = "duckdb"
    duckdb_path: Path | None = None
    parquet_root: Path | None = None


@dataclass(frozen=True)
class PathsSite:
    """Where this host keeps the registration directory (the freeze record and each family's
    record) and the cache (models, tokenizers; the step outputs sit beside it: posteriors,
    reports, scoring chunks). ``None`` keeps the project's defaults (data/registration,
    data/cache). A rehearsal (``fear rehearse``) points both at its own workspace."""

    registration_dir: Path | None = None
    cache_dir: Path | None = None


@dataclass(frozen=True)
class PowerSamplerSite:
    """How this host fits power-simulation batches (``simulation.sampler_path``): ``path``
    auto (the accelerator path where JAX reports a GPU and ``validation`` passed; else the
    nutpie loop), nutpie, or accelerator (forced; a registered family's batch still needs a
    passed validation). ``validation``: the JSON of a ``benchmarks/power_gpu.py validate`` run
    of the registered simulation sampler (None: none)."""

    path: str = "auto"
    validation: Path | None = None


@dataclass(frozen=True)
class SiteConfig:
    """One host's configuration (see the module docstring); every field has a default."""

    path: Path | None = None
    #: Registered checkpoint name -> the local directory holding its files.
    checkpoints: Mapping[str, Path] = field(default_factory=dict)
    #: "" = cuda when available, else cpu; or a torch device string ("cpu", "cuda", "cuda:1").
    device: str = ""
    #: torch CPU threads (0 = torch's default).
    cpu_threads: int = 0
    #: Documents decoded together by greedy generation.
    generation_batch: int = 16
    #: The most new tokens one scoring forward runs: a packed row of continuations, or one
    #: chunk of a longer prefix (throughput and memory only; the scores are the same).
    pack_tokens: int = 1024
    #: Dagster pool -> slots on this host (e.g. {"gpu": 4} on a four-GPU host).
    pools: Mapping[str, int] = field(default_factory=dict)
    store: StoreSite = field(default_factory=StoreSite)
    paths: PathsSite = field(default_factory=PathsSite)
    #: Opt-in declarative automation: a family's next stage runs when its inputs are fresh and
    #: their blocking checks passed (needs the daemon that ``dagster dev`` / ``fear ui`` starts).
    automation: bool = False
    #: Retries of a failed model step (each retry resumes from the finished chunks).
    retries: int = 2
    power_sampler: PowerSamplerSite = field(default_factory=PowerSamplerSite)

    def checkpoint_dir(self, checkpoint: str) -> Path | None:
        """The local directory this host gives ``checkpoint`` (None: not configured here)."""
        return self.checkpoints.get(checkpoint)

    def missing_checkpoints(self) -> dict[str, Path]:
        """Configured checkpoints whose directory does not exist on this host."""
        return {name: p for name, p in self.checkpoints.items() if not p.is_dir()}


def site_path() -> Path | None:
    """``$FEAR_ASSETS_SITE`` (None when unset: the defaults)."""
    value = os.environ.get(SITE_ENV, "").strip()
    return Path(value) if value else None


def unknown_keys(path: Path, where: str, mapping: Mapping[str, Any], known) -> None:
    """Reject a key the site configuration does not define, as a :class:`SiteError`."""
    sections.unknown_keys(path, where, mapping, known, error=SiteError)


def _int(path: Path, where: str, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SiteError(path, where, key, f"expected an integer >= {minimum}, got {value!r}",
                        f"write a whole number of at least {minimum}")
    return value


def _dir(path: Path, where: str, key: str, value: Any, what: str = "directory") -> Path:
    if not isinstance(value, str) or not value.strip():
        raise SiteError(path, where, key, f"expected a {what} path, got {value!r}",
                        f"write the {what} as a string (absolute, or relative to the site file)")
    p = Path(value).expanduser()
    return p if p.is_absolute() else (path.parent / p).resolve()


_TOP = ("checkpoints", "device", "cpu_threads", "engine", "pools", "store", "paths", "automation", "retries",
        "power_sampler")
#: ``power_sampler.path``'s choices (``simulation.sampler_path.HOST_CHOICES``).
POWER_PATHS = ("auto", "nutpie", "accelerator")


def parse_site(path: Path, raw: Any, registered_checkpoints=None) -> SiteConfig:
    """Validate one site mapping. ``registered_checkpoints`` (the settings' ``models`` keys),
    when given, rejects a checkpoint the protocol does not register (a typo would otherwise
    leave the real one unconfigured)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SiteError(path, "<top>", "<file>", f"expected a mapping, got {type(raw).__name__}",
                        "write the site configuration as 'key: value' lines (see deploy/site.example.yaml)")
    unknown_keys(path, "<top>", raw, _TOP)
    checkpoints: dict[str, Path] = {}
    raw_ck = raw.get("checkpoints") or {}
    if not isinstance(raw_ck, Mapping):
        raise SiteError(path, "<top>", "checkpoints", "expected a mapping of checkpoint name to directory",
                        "write 'checkpoints: {Qwen/Qwen2.5-7B-Instruct: /models/qwen2.5-7b-instruct}'")
    known = sorted(registered_checkpoints) if registered_checkpoints is not None else None
    for name, value in raw_ck.items():
        if known is not None and name not in known:
            unknown_keys(path, "checkpoints", {name: value}, known)
        checkpoints[str(name)] = _dir(path, "checkpoints", str(name), value)
    device = raw.get("device", "")
    if not isinstance(device, str) or not (device in ("", "cpu", "mps") or device.split(":")[0] == "cuda"):
        raise SiteError(path, "<top>", "device", f"unknown device {device!r}",
                        "write cpu, cuda, cuda:N, mps, or leave it empty (cuda when available, else cpu)")
    engine = raw.get("engine") or {}
    if not isinstance(engine, Mapping):
        raise SiteError(path, "<top>", "engine", "expected a mapping",
                        "write 'engine: {generation_batch: 16, pack_tokens: 1024}'")
    unknown_keys(path, "engine", engine, ("generation_batch", "pack_tokens"))
    pools_raw = raw.get("pools") or {}
    if not isinstance(pools_raw, Mapping):
        raise SiteError(path, "<top>", "pools", "expected a mapping of pool to slots", "write 'pools: {gpu: 1}'")
    unknown_keys(path, "pools", pools_raw, POOLS)
    pools = {str(k): _int(path, "pools", str(k), v, 1) for k, v in pools_raw.items()}
    store_raw = raw.get("store") or {}
    if not isinstance(store_raw, Mapping):
        raise SiteError(path, "<top>", "store", "expected a mapping", "write 'store: {kind: duckdb}'")
    unknown_keys(path, "store", store_raw, ("kind", "duckdb_path", "parquet_root"))
    kind = store_raw.get("kind", "duckdb")
    if kind not in STORES:
        raise SiteError(path, "store", "kind", f"unknown store {kind!r}", f"write one of {', '.join(STORES)}")
    store = StoreSite(kind=kind,
                      duckdb_path=_dir(path, "store", "duckdb_path", store_raw["duckdb_path"], "file")
                      if store_raw.get("duckdb_path") is not None else None,
                      parquet_root=_dir(path, "store", "parquet_root", store_raw["parquet_root"])
                      if store_raw.get("parquet_root") is not None else None)
    paths_raw = raw.get("paths") or {}
    if not isinstance(paths_raw, Mapping):
        raise SiteError(path, "<top>", "paths", "expected a mapping",
                        "write 'paths: {registration_dir: /srv/fear/registration, cache_dir: /srv/fear/cache}'")
    unknown_keys(path, "paths", paths_raw, ("registration_dir", "cache_dir"))
    paths = PathsSite(**{k: _dir(path, "paths", k, paths_raw[k]) for k in ("registration_dir", "cache_dir")
                         if paths_raw.get(k) is not None})
    automation = raw.get("automation", False)
    if not isinstance(automation, bool):
        raise SiteError(path, "<top>", "automation", f"expected true or false, got {automation!r}",
                        "write 'automation: true' to let the daemon run each next stage, or false")
    power_raw = raw.get("power_sampler") or {}
    if not isinstance(power_raw, Mapping):
        raise SiteError(path, "<top>", "power_sampler", "expected a mapping",
                        "write 'power_sampler: {path: auto, validation: results/power_validation.json}'")
    unknown_keys(path, "power_sampler", power_raw, ("path", "validation"))
    power_path = power_raw.get("path", "auto")
    if power_path not in POWER_PATHS:
        raise SiteError(path, "power_sampler", "path", f"unknown path {power_path!r}",
                        f"write one of {', '.join(POWER_PATHS)}")
    power_sampler = PowerSamplerSite(power_path, _dir(path, "power_sampler", "validation", power_raw["validation"],
                                                      "file") if power_raw.get("validation") is not None else None)
    return SiteConfig(path=path, checkpoints=checkpoints, device=device,
                      cpu_threads=_int(path, "<top>", "cpu_threads", raw.get("cpu_threads", 0), 0),
                      generation_batch=_int(path, "engine", "generation_batch", engine.get("generation_batch", 16), 1),
                      pack_tokens=_int(path, "engine", "pack_tokens", engine.get("pack_tokens", 1024), 16),
                      pools=pools, store=store, paths=paths, automation=automation,
                      retries=_int(path, "<top>", "retries", raw.get("retries", 2), 0), power_sampler=power_sampler)


def load_site(path: Path | str | None = None, registered_checkpoints=None) -> SiteConfig:
    """The site configuration at ``path`` (default: ``$FEAR_ASSETS_SITE``; neither: defaults)."""
    path = Path(path) if path is not None else site_path()
    if path is None:
        return SiteConfig()
    if not path.is_file():
        raise SiteError(path, "<file>", SITE_ENV, "no such file",
                        f"create it (see deploy/site.example.yaml) or point {SITE_ENV} / --site at the right file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise SiteError(path, "<file>", "<encoding>", f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                        "re-save the file as UTF-8") from exc
    except yaml.YAMLError as exc:
        raise SiteError(path, "<file>", "<yaml>", f"not valid YAML ({exc})", "fix the YAML syntax at the line named") from exc
    return parse_site(path, raw, registered_checkpoints)
