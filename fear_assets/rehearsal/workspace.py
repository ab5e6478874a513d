"""A rehearsal's workspace: a registered family at its registered shape, on random-weight
stand-ins, in a directory of its own (``fear rehearse``).

A rehearsal changes no registered file and touches no other run: it writes, under its own
root, a copy of the registered settings whose one difference is the family's
``reduced_design`` (confirmatory frames per fear, optionally fewer depths, a reduced power
simulation, ``rehearsal: true``; its ``reason`` is said in every output), a freeze record of
that copy, a site configuration that places the stand-in checkpoints exactly as a lab places
real weights (``checkpoints:``) and points the store, the registration directory and the
cache at the workspace, and a Dagster instance (``dagster.yaml``). Every step then runs
through the product's own ``fear run`` and ``fear register`` in that environment.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from fear_assets.core.settings import DATA_DIR, DEFAULT_CACHE_DIR, PROJECT_ROOT, SETTINGS_ENV, load_settings
from fear_assets.core.site import SITE_ENV
from fear_assets.registration.freeze import freeze_record, write_record
from fear_assets.registration.record import atomic_write
from fear_assets.rehearsal.models import RehearsalError
from fear_assets.stimuli.bank import load_bank

#: The reduced power simulation of a rehearsal: every simulated model once per scenario, on a
#: short sampler, so that each model the reading needs is compiled and sampled at the shape.
REHEARSAL_POWER = {"datasets": 1, "scenarios": ["meaningful", "null"],
                   "sampler": {"draws": 100, "tune": 100, "chains": 2},
                   "blocks": ["primary", "recall", "service_relevance", "control_instructed_interaction",
                              "control_instructed_priority", "control_marked_priority", "control_addressee_name",
                              "judge", "probe", "forced_choice"]}
#: Where the rehearsals live by default (one directory per family and shape).
DEFAULT_ROOT = DATA_DIR / "rehearsal"


@dataclass(frozen=True)
class Thinning:
    """What a small rehearsal (the test suite's) thins beyond the confirmatory frames and the
    depths, each through a field the reduced design already has and every design step already
    reads: the pilot frames (``pilot_frames``: these ids), the name rotations built at every
    depth (``rotations_by_depth``; both orders stay, so 4.3's option balance holds) and the
    secondary-class events per class (``events_per_class``). ``quick_fits``: every fit of the
    pilot and the analysis on the reduced power simulation's short sampler, without the
    convergence remedy's extensions (the reduced design's ``sampler`` and ``max_extensions``):
    every model is still built, compiled and sampled on the rows it reads. The default thins
    nothing: a rehearsal at the registered shape."""

    pilot_frames: tuple[str, ...] | None = None
    rotations: tuple[int, ...] | None = None
    events_per_class: int | None = None
    quick_fits: bool = False

    @property
    def thins_design(self) -> bool:
        """Whether fewer documents are built (pilot frames, rotations or events), not only fits."""
        return any(v is not None for v in (self.pilot_frames, self.rotations, self.events_per_class))

    def __bool__(self) -> bool:
        return self.quick_fits or self.thins_design

    def said(self) -> str:
        """The clause of the reduction's sentence (empty when nothing is thinned)."""
        parts = []
        if self.pilot_frames is not None:
            parts.append(f"pilot frames {', '.join(self.pilot_frames)} only")
        if self.rotations is not None:
            parts.append(f"name rotation(s) {', '.join(map(str, self.rotations))} only at every depth")
        if self.events_per_class is not None:
            parts.append(f"{self.events_per_class} secondary-class event(s) per class")
        if self.quick_fits:
            short = REHEARSAL_POWER["sampler"]
            parts.append(f"every fit on a short sampler ({short['draws']} draws after {short['tune']} tuning steps, "
                         f"{short['chains']} chains) without the convergence remedy's extensions, so no contrast "
                         "can meet the convergence rule")
        return "; ALSO THINNED for a quick check: " + ", ".join(parts) if parts else ""


def first_pilot_frames(bank, fears: Sequence[str], per_fear: int) -> tuple[str, ...]:
    """The lowest-numbered ``per_fear`` pilot frames of every fear (the reduced designs' rule)."""
    out = []
    for fear in fears:
        frames = bank.frames_of(fear, "pilot")
        if not 1 <= per_fear <= len(frames):
            raise RehearsalError(f"--pilot-frames {per_fear}: {fear} has {len(frames)} registered pilot frame(s). "
                                 f"Fix: keep between 1 and {len(frames)}")
        out += [f.id for f in frames[:per_fear]]
    return tuple(out)


def thinning_of(pilot_frames_per_fear: int | None, rotations: str | None, events_per_class: int | None,
                settings=None, quick_fits: bool = False) -> Thinning:
    """A :class:`Thinning` from the command line's values (``--pilot-frames N``, ``--rotations
    R,...``, ``--events N``, ``--quick-fits``; None keeps the registered value): the pilot
    frames resolved to the lowest-numbered ids of each fear in the registered bank."""
    try:
        kept = tuple(int(r) for r in rotations.split(",")) if rotations else None
    except ValueError:
        raise RehearsalError(f"--rotations {rotations!r}: write rotation numbers separated by commas (e.g. 1,2)")
    pilot = None
    if pilot_frames_per_fear is not None:
        settings = settings if settings is not None else load_settings()
        pilot = first_pilot_frames(load_bank(settings=settings), settings.fears, pilot_frames_per_fear)
    return Thinning(pilot, kept, events_per_class, bool(quick_fits))


@dataclass(frozen=True)
class Rehearsal:
    """One rehearsal: the family, its confirmatory frames per fear, the depths kept (token
    counts; None: every registered depth), the workspace root and the dtype the stand-ins
    compute in (None: the registered one)."""

    family: str
    frames: int
    depths: tuple[int, ...] | None
    root: Path
    dtype: str | None = None
    thinning: Thinning = Thinning()

    @property
    def settings_path(self) -> Path:
        return self.root / "protocol_settings.yaml"

    @property
    def site_path(self) -> Path:
        return self.root / "site.yaml"

    @property
    def registration_dir(self) -> Path:
        return self.root / "registration"

    @property
    def cache_dir(self) -> Path:
        """The workspace's cache: a link to the project's (tokenizers, stand-in models), so the
        step outputs, which sit beside the cache, land in the workspace."""
        return self.root / "cache"

    @property
    def duckdb_path(self) -> Path:
        return self.root / "fear_assets.duckdb"

    @property
    def note_path(self) -> Path:
        return self.root / "rehearsal_note.txt"

    def environment(self) -> dict[str, str]:
        """The process environment every rehearsal step runs in."""
        env = {k: v for k, v in os.environ.items() if k not in ("FEAR_ASSETS_DUCKDB", "FEAR_ASSETS_STORE")}
        return {**env, SETTINGS_ENV: str(self.settings_path), SITE_ENV: str(self.site_path),
                "DAGSTER_HOME": str(self.root)}


def reduction_reason(family: str, frames: int, registered_frames: int, depths: Sequence[int] | None,
                     registered_depths: Sequence[int], dtype: str | None = None,
                     thinning: Thinning = Thinning()) -> str:
    """The sentence every output of the rehearsal carries (the reduced design's ``reason``)."""
    kept = ("every registered depth" if depths is None or list(depths) == list(registered_depths) else
            f"depths {', '.join(map(str, depths))} of the registered {', '.join(map(str, registered_depths))} tokens")
    numerics = (f"; the stand-ins compute in {dtype} (a CPU emulates the registered bfloat16 several times "
                "slower)" if dtype else "")
    return (f"REHEARSAL of {family} at its registered shape on random-weight stand-in models: every output is "
            f"meaningless as science. Reduced only in {frames} confirmatory frame(s) per fear (registered: "
            f"{registered_frames}), {kept}, and a reduced power simulation (one dataset per scenario, a short "
            f"sampler){numerics}{thinning.said()}; every block, branch and reader of the registered design is scored.")


def rehearsal_settings(raw: Mapping, family: str, frames: int, depths: Sequence[int] | None,
                       dtype: str | None = None, thinning: Thinning = Thinning()) -> dict:
    """The registered settings mapping with ``family`` turned into its rehearsal: a
    ``reduced_design`` with ``rehearsal: true``, the confirmatory frames per fear, the reduced
    power simulation, (``depths``) the depths kept, (``dtype``) the dtype its checkpoints
    load in and (``thinning``) a small rehearsal's thinned pilot, rotations and events. Pure;
    nothing else changes."""
    families = dict(raw.get("families") or {})
    if family not in families:
        raise RehearsalError(f"family {family!r} is not registered (registered: {', '.join(families)}). "
                             "Fix: name one of the registered families")
    spec = dict(families[family])
    if spec.get("role") == "embedded":
        raise RehearsalError(f"{family} is the embedded demonstration, not a registered family: rehearse one of "
                             f"{', '.join(k for k, f in families.items() if f.get('role') != 'embedded')}")
    if frames < 1:
        raise RehearsalError(f"--frames {frames}: a rehearsal needs at least 1 confirmatory frame per fear")
    registered_depths = list(spec["depth_tokens"])
    if depths is not None:
        unknown = [d for d in depths if d not in registered_depths]
        if unknown or not depths:
            raise RehearsalError(f"--depths {', '.join(map(str, depths))}: {family} registers the depths "
                                 f"{', '.join(map(str, registered_depths))} (tokens). Fix: keep some of those")
        spec["depth_tokens"] = sorted(depths)
    fears = list(raw["bank"]["fears"])
    lo, hi = raw["bank"]["frame_sets"]["confirmatory"]
    registered_frames = (hi - lo + 1)
    models = {name: dict(entry) for name, entry in (raw.get("models") or {}).items()}
    if dtype is not None:
        for role in ("tested", "base", "scorer", "judge"):
            if spec.get(role):
                models[spec[role]]["dtype"] = dtype
    spec["reduced_design"] = {
        "reason": reduction_reason(family, frames, registered_frames, depths, registered_depths, dtype, thinning),
        "confirmatory_frames_per_fear": int(frames),
        "rehearsal": True,
        "power": {**REHEARSAL_POWER, "frames": int(frames) * len(fears)},
    }
    if thinning.rotations is not None:
        registered_rotations = sorted(int(r) for r in raw["names"]["rotations"])
        if not thinning.rotations or any(r not in registered_rotations for r in thinning.rotations):
            raise RehearsalError(f"--rotations {', '.join(map(str, thinning.rotations))}: the registered name "
                                 f"rotations are {', '.join(map(str, registered_rotations))}. Fix: keep some of those")
        spec["reduced_design"]["rotations_by_depth"] = {
            f"d{i}": sorted(thinning.rotations) for i in range(1, len(spec["depth_tokens"]) + 1)}
    if thinning.pilot_frames is not None:
        spec["reduced_design"]["pilot_frames"] = list(thinning.pilot_frames)
    if thinning.events_per_class is not None:
        registered_events = int(raw["bank"]["events_per_class"])
        if not 1 <= thinning.events_per_class <= registered_events:
            raise RehearsalError(f"--events {thinning.events_per_class}: the bank registers {registered_events} events "
                                 f"per class. Fix: keep between 1 and {registered_events}")
        spec["reduced_design"]["events_per_class"] = int(thinning.events_per_class)
    if thinning.quick_fits:
        spec["reduced_design"]["sampler"] = dict(REHEARSAL_POWER["sampler"])
        spec["reduced_design"]["max_extensions"] = 0
    families[family] = spec
    return {**raw, "families": families, "models": models}


def prepare_workspace(rehearsal: Rehearsal, registered_settings: Path, directories: Mapping[str, Path],
                      cache_dir: Path = DEFAULT_CACHE_DIR, device: str = "cpu") -> Rehearsal:
    """Write the rehearsal's settings, freeze record, site file, instance and note under its
    root (idempotent: a second call rewrites the same files, so a rerun resumes). ``directories``:
    checkpoint -> the stand-in's directory (``rehearsal.models.build_family``)."""
    root = rehearsal.root
    root.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path(registered_settings).read_text(encoding="utf-8"))
    text = ("# A REHEARSAL's settings, written by `fear rehearse`: the registered file with one family's\n"
            "# reduced_design added. Not a registered file; do not edit.\n"
            + yaml.safe_dump(rehearsal_settings(raw, rehearsal.family, rehearsal.frames, rehearsal.depths,
                                                rehearsal.dtype, rehearsal.thinning),
                             sort_keys=False, allow_unicode=True, width=120))
    atomic_write(rehearsal.settings_path, text)
    settings = load_settings(rehearsal.settings_path)
    write_record(freeze_record(settings, load_bank(settings=settings)), rehearsal.registration_dir)
    link = rehearsal.cache_dir
    if not link.exists():
        link.symlink_to(Path(cache_dir).resolve(), target_is_directory=True)
    site = {"checkpoints": {name: str(Path(p).resolve()) for name, p in sorted(directories.items())},
            "device": device,
            "store": {"kind": "duckdb", "duckdb_path": str(rehearsal.duckdb_path)},
            "paths": {"registration_dir": str(rehearsal.registration_dir), "cache_dir": str(link)}}
    atomic_write(rehearsal.site_path, "# A rehearsal's site configuration (fear rehearse): stand-in checkpoints.\n"
                 + yaml.safe_dump(site, sort_keys=False))
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", root / "dagster.yaml")
    atomic_write(rehearsal.note_path, "Rehearsal: no supplementary note exists for a rehearsal; this file stands in "
                 "for it so that the record is issued through the product's own command.\n")
    return rehearsal
