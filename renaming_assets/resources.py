"""The study resource: where the bundle lives, and (tests/demo only) a reduced cohort."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import dagster as dg

from renaming_assets.settings import SETTINGS, Settings

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class RenamingStudy(dg.ConfigurableResource):
    """``bundle_dir`` (relative paths are under the project root). ``reduced_worlds_per_family``
    is for tests and demos only: 0 keeps the registered cohort; any other value builds a
    smaller bundle that is not the registered study."""

    bundle_dir: str = "data/renaming/bundle"
    reduced_worlds_per_family: int = 0

    def settings(self) -> Settings:
        if not self.reduced_worlds_per_family:
            return SETTINGS
        return dataclasses.replace(SETTINGS, cohort=dataclasses.replace(
            SETTINGS.cohort, worlds_per_family=self.reduced_worlds_per_family))

    def bundle(self) -> Path:
        path = Path(self.bundle_dir)
        return path if path.is_absolute() else PROJECT_ROOT / path
