"""The registered inputs (settings, bank, registration record, caches) as one resource, and
each family's registered view in the family's own mode (from its registration record)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import dagster as dg

from fear_assets.core.registered import Registered, registered
from fear_assets.core.settings import (DEFAULT_BANK_DIR, DEFAULT_CACHE_DIR, DEFAULT_REGISTRATION_DIR,
                                       ProtocolSettings, load_settings, settings_path as current_settings_path)
from fear_assets.core.site import load_site
from fear_assets.registration.issue import family_mode, refuse_changed_inputs
from fear_assets.registration.record import read_family_record
from fear_assets.stimuli.bank import Bank, load_bank


@lru_cache(maxsize=8)
def _settings(path: str, mtime: float) -> ProtocolSettings:
    return load_settings(path)


@lru_cache(maxsize=8)
def _bank(root: str, settings_path: str, stamp: tuple) -> Bank:
    return load_bank(root, load_settings(settings_path))


def _stamp(root: Path) -> tuple:
    """Modification times of every bank file: the cache reloads when any file changes."""
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*.yaml")))


#: This host's directories (the site configuration's ``paths``), read once when the definitions
#: load, like the rest of the site: the project's data/ where the site names none.
SITE_PATHS = load_site().paths


class ProtocolResource(dg.ConfigurableResource):
    """Where the registered settings, the bank and the registration record live."""

    #: Default: the file the definition-time layout read (``core.settings.settings_path``).
    settings_path: str = str(current_settings_path())
    bank_dir: str = str(DEFAULT_BANK_DIR)
    registration_dir: str = str(SITE_PATHS.registration_dir or DEFAULT_REGISTRATION_DIR)
    cache_dir: str = str(SITE_PATHS.cache_dir or DEFAULT_CACHE_DIR)

    def settings(self) -> ProtocolSettings:
        path = Path(self.settings_path)
        return _settings(str(path), path.stat().st_mtime if path.exists() else 0.0)

    def bank(self) -> Bank:
        root = Path(self.bank_dir)
        return _bank(str(root), self.settings_path, _stamp(root))

    def mode(self, family_key: str) -> str:
        """The family's mode: confirmatory once its registration record is issued, else pilot."""
        return family_mode(self.registration_dir, family_key)

    def rehearsal(self, family_key: str) -> bool:
        """Whether the family is a rehearsal (its gates never block: ``registration.issue.gate_blocks``);
        a family the settings do not name is not."""
        family = self.settings().families.get(family_key)
        return bool(family is not None and family.reduced_design is not None and family.reduced_design.rehearsal)

    def view(self, family_key: str) -> Registered:
        """The family's registered view in its own mode. A registered family whose settings,
        bank or registered code differ from its issued record is refused (FreezeError naming
        each change); a family in pilot mode is never compared."""
        settings = self.settings()
        mode = self.mode(family_key)
        if mode == "confirmatory":
            refuse_changed_inputs(self.registration_dir, family_key,
                                  read_family_record(self.registration_dir, family_key), settings, self.bank())
        return registered(settings, family_key, mode)

    def output_path(self, kind: str, family: str | None = None, name: str | None = None) -> Path:
        """Where a step writes its files beside the cache: ``<cache_dir>/../<kind>[/<family>][/<name>]``
        (kinds: posteriors, power, reports, records; the topic counts are ``output_path("topic_counts.csv")``).
        The one rule for every output path, so a site that moves the cache moves them all."""
        path = Path(self.cache_dir).parent / kind
        if family is not None:
            path = path / family
        return path / name if name is not None else path
