"""The one entry point: a single Definitions object for the "Two Facts, One Gate" location.

Asset groups are the protocol's stages, in its order (Appendix C): each stage's assets are
loaded from its module or package under ``fear_assets/defs/assets`` with the stage as group name.
Jobs are defined by group selection, one per stage and partitioning (Dagster runs one
partitioning per run); ``fear_assets.defs.main`` runs them in stage order.
"""

from __future__ import annotations

import warnings

import dagster as dg

# Partition mappings and data versions are Dagster beta APIs we rely on deliberately.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.core.site import SiteConfig, load_site
from fear_assets.defs.assets import analysis, collection, pilot, probes, reading, registration, report, stimuli
from fear_assets.defs.automation import DEFINITION_SITE, automated, automation_sensor
from fear_assets.defs.partitions import partitioning_of_definition
from fear_assets.defs.resources.power import PowerSamplerResource
from fear_assets.defs.resources import ProtocolResource, store_io_manager
from fear_assets.defs.resources.models import LanguageModelResource

#: The protocol's stages in order, each with the module or package holding its assets.
STAGES = (("stimuli", stimuli), ("pilot", pilot), ("registration", registration), ("collection", collection),
          ("probes", probes), ("analysis", analysis), ("reading", (reading, report)))
STAGE_NAMES = tuple(name for name, _ in STAGES)



def _assets(module, stage: str) -> list:
    if isinstance(module, tuple):  # a stage held in several modules (reading: the reading and its report)
        return [a for m in module for a in _assets(m, stage)]
    if hasattr(module, "__path__"):  # a stage package: every module in it
        return list(dg.load_assets_from_package_module(module, group_name=stage))
    return list(dg.load_assets_from_modules([module], group_name=stage))


def _checks(module) -> list:
    if isinstance(module, tuple):
        return [c for m in module for c in _checks(m)]
    if hasattr(module, "__path__"):
        return list(dg.load_asset_checks_from_package_module(module))
    return list(dg.load_asset_checks_from_modules([module]))


all_assets = [a for stage, module in STAGES for a in _assets(module, stage)]
all_checks = [c for _, module in STAGES for c in _checks(module)]


def partitioning_of(asset) -> str:
    return partitioning_of_definition(asset.partitions_def)


def stage_jobs() -> list:
    """One job per stage and partitioning, selected by group (and partitions definition)."""
    jobs = []
    for stage in STAGE_NAMES:
        by: dict[str, list] = {}
        for a in all_assets:
            if a.group_names_by_key.get(next(iter(a.keys))) == stage:
                by.setdefault(partitioning_of(a), []).extend(a.keys)
        for partitioning, keys in sorted(by.items()):
            jobs.append(dg.define_asset_job(
                f"{stage}_{partitioning}_job", selection=dg.AssetSelection.groups(stage) & dg.AssetSelection.assets(*keys),
                description=f"Stage {stage} ({partitioning.replace('_', ' ')}): the protocol's {stage} assets and "
                            "their checks."))
    return jobs


def resources(duckdb_path: str | None = None, *, site: SiteConfig | None = None, **protocol_paths: str) -> dict:
    """The resources on this host: the store, the registered inputs, the power simulation's
    path (the site's ``power_sampler``), and the language model
    with the site configuration's device, threads, checkpoint directories and engine knobs
    (``site``, default ``$FEAR_ASSETS_SITE``; none: the defaults, which the demo uses)."""
    cache = {"cache_dir": protocol_paths["cache_dir"]} if "cache_dir" in protocol_paths else {}
    protocol = ProtocolResource(**protocol_paths)
    # A checkpoint name the settings do not register is a typo in the site file: refused here.
    site = site if site is not None else load_site(registered_checkpoints=protocol.settings().models)
    # The IO manager is the only switch between stores: $FEAR_ASSETS_STORE, else the site's store
    # (default: the DuckDB file).
    return {"io_manager": store_io_manager(duckdb_path, site=site), "protocol": protocol,
            "language_model": LanguageModelResource.from_site(site, **cache),
            "power_sampler": PowerSamplerResource.from_site(site)}


def build_definitions(duckdb_path: str | None = None, *, automation: bool | None = None,
                      **protocol_paths: str) -> dg.Definitions:
    """The Definitions with resources bound to a store (the main job passes its own). With
    ``automation`` (default: the site configuration's), the automated stages' assets carry
    their conditions and the automation sensor is on (``defs.automation``); without, the
    definitions have no condition and no sensor."""
    on = DEFINITION_SITE.automation if automation is None else automation
    registration_dir = protocol_paths.get("registration_dir", ProtocolResource().registration_dir)
    assets = automated(all_assets, registration_dir=registration_dir) if on else all_assets
    return dg.Definitions(assets=assets, asset_checks=all_checks, jobs=stage_jobs(),
                          sensors=[automation_sensor(assets)] if on else [],
                          resources=resources(duckdb_path, **protocol_paths))


jobs = stage_jobs()
defs = build_definitions()
