"""The second code location: the anchor-fixed renaming study."""

from __future__ import annotations

import dagster as dg

from renaming_assets import assets
from renaming_assets.resources import RenamingStudy

all_assets = [assets.renaming_family_bodies, assets.renaming_bundle, assets.renaming_family_audit,
              assets.renaming_audit, assets.renaming_precision, assets.renaming_freeze,
              assets.renaming_analysis, assets.renaming_synthetic_log]

defs = dg.Definitions(assets=all_assets, resources={"study": RenamingStudy()})
