"""The one entry point: a single Definitions object for the "Two Facts, One Gate" location."""

from __future__ import annotations

import warnings

import dagster as dg

# Partition mappings and data versions are Dagster beta APIs we rely on deliberately.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from fear_assets.assets import analysis, design, lm, pilot, probes, stimuli
from fear_assets.assets import simulation  # the power gate (6.3)
from fear_assets.resources import ProtocolResource, store_io_manager
from fear_assets.resources.models import LanguageModelResource

all_assets = [stimuli.frame_bank, lm.name_gate, design.trial_table, design.assignment_key, design.trial_accounting,
              lm.model_manifest, lm.sentence_surprisal, lm.base_sentence_surprisal, lm.judge_sentence_surprisal, lm.scores, lm.pilot_control_scores, pilot.pilot_depths,
              pilot.matched_frames, pilot.zero_preference, pilot.binding_results, pilot.report_scoring,
              pilot.pilot_controls, pilot.registration_record, probes.probes, analysis.h4_posterior,
              analysis.posteriors, analysis.section8_reading, analysis.cross_family_statement]
all_assets += [simulation.power_pilot_estimates, simulation.power_simulation, simulation.power_summary]
all_assets += [lm.name_candidates]  # 4.2 amendment proposals
all_checks = [stimuli.bank_freeze, design.accounting_closed, lm.five_single_token_names, lm.matches_registration_record,
              probes.controls_at_chance, probes.pilot_probe_rules, analysis.h4_converged,
              pilot.matching_gate, pilot.zero_preference_gate, pilot.binding_gate, pilot.scorer_agreement,
              pilot.positive_controls_pass, pilot.registration_gates, analysis.posteriors_converged]
all_checks += [simulation.power_targets_met]

#: Everything that exists so far for one family; the main job runs it per partition.
foundation_job = dg.define_asset_job(
    "foundation_job",
    selection=dg.AssetSelection.assets(design.trial_table, design.assignment_key),
    description="Trial table and assignment key of one family x depth partition.",
)


def resources(duckdb_path: str | None = None, **protocol_paths: str) -> dict:
    cache = {"cache_dir": protocol_paths["cache_dir"]} if "cache_dir" in protocol_paths else {}
    # The IO manager is the only switch between stores: $FEAR_ASSETS_STORE (default: the DuckDB file).
    return {"io_manager": store_io_manager(duckdb_path), "protocol": ProtocolResource(**protocol_paths),
            "language_model": LanguageModelResource(**cache)}


jobs = [foundation_job]
defs = dg.Definitions(assets=all_assets, asset_checks=all_checks, jobs=jobs, resources=resources())

# Issue 15: the Stage 2 report (per family and across families) and the data record (Appendix B).
from fear_assets.assets import report as report_assets  # noqa: E402

all_assets += [report_assets.stage2_report, report_assets.stage2_report_all, report_assets.data_record]
defs = dg.Definitions(assets=all_assets, asset_checks=all_checks, jobs=jobs, resources=resources())
