"""The Stage 1 registration record of one configuration (Appendix C step 4, D6)."""

import json

import dagster as dg
import pandas as pd

from fear_assets.lm.models import manifest_digest
from fear_assets.lm.name_gate import selected_names
from fear_assets.modes import GATES_BLOCK
from fear_assets.partitions import FAMILY_EXPR, family_partitions
from fear_assets.pilot.depth_rules import band_keys, stored_band
from fear_assets.registration.gates import deviations, registered_power_result, registration_status
from fear_assets.registration.pilot_gates import final_selection, gates_table, registration_gates as gate_verdicts
from fear_assets.registration.pilot_gates import h4_pilot_declarations
from fear_assets.registration.record import analysis_code_sha256, read_power_section, write_family_record
from fear_assets.resources.protocol import ProtocolResource
from fear_assets.settings import depth_key


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "json"},
          deps=[dg.AssetKey("power_summary")])  # 6.3: the power gate comes before registration
def registration_record(context: dg.AssetExecutionContext, protocol: ProtocolResource, name_gate: pd.DataFrame,
                        model_manifest: pd.DataFrame, matched_frames: pd.DataFrame, zero_preference: pd.DataFrame,
                        binding_results: pd.DataFrame, report_scoring: pd.DataFrame, pilot_depths: pd.DataFrame,
                        pilot_controls: pd.DataFrame, pilot_probe_controls: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Stage 1 registration record (Appendix C step 4): "frozen hashes (bank, settings,
    model manifest, analysis code), selected names and frames, depth band and H5 depth, the
    pilot sigma for gate (c), every gate's outcome with its numbers", what is carried to the
    reading (in-context binding, the power result) and the stated deviations. Written as JSON
    and Markdown under data/registration/<family>/ (a draft in pilot mode; in confirmatory
    mode registered only when every gate passes, the power gate included, else refused);
    the confirmatory trial table reads it as an asset input, so a re-registration marks
    the confirmatory design and everything after it stale."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    frames, replacements, shortfall = final_selection(
        matched_frames, binding_results, zero_preference, {i: bank.item(i).number for i in matched_frames["item_id"]},
        settings.confirmatory_frames_per_fear(family_key), {r.rewrite_of: r.id for r in bank.rewrites})
    # 6.3: the stored power result, written by power_summary (None until it has run).
    power = read_power_section(protocol.registration_dir, family_key)
    gates, binding_in_context = gate_verdicts(
        name_gate, matched_frames, settings.matching.tost_alpha, zero_preference, binding_results, report_scoring,
        pilot_probe_controls, pilot_controls, frames, shortfall, power, family_key)
    failed_gates = [n for n, g in gates.items() if not g["passed"]]
    p0, band = pilot_depths.iloc[0], stored_band(pilot_depths)
    zero = settings.zero_preference
    record = {
        "protocol": settings.raw["protocol"]["name"], "protocol_version": settings.raw["protocol"]["version"],
        "family": family_key, "mode": settings.mode, "status": registration_status(settings.mode, failed_gates),
        "stand_in": family.stand_in or "", "reduced_design": family.reduced_design.reason if family.reduced_design else "",
        "settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
        "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256(),
        "selected_names": selected_names(name_gate), "selected_frames": frames,
        "replacements": replacements, "depth_band": band,
        "band_rule": str(p0["band_rule"]), "h5_depth": int(p0["h5_depth"]), "h5_rule": str(p0["h5_rule"]),
        "pilot_sigma": round(float(pilot_controls["pilot_sigma"].iloc[0]), 6),
        "pilot_sigma_judge": (None if pd.isna(pilot_controls["pilot_sigma_judge"].iloc[0])
                              else round(float(pilot_controls["pilot_sigma_judge"].iloc[0]), 6)),
        "gates": gates, "failed_gates": failed_gates, "binding_in_context": binding_in_context, "power": power,
        "h4_pilot": h4_pilot_declarations(pilot_probe_controls),  # 6.1: carried to H4's row, never a gate
        "not_run": [] if registered_power_result(power) else
                   ["power simulation (6.3, Appendix C step 3): no registered power result (none stored, "
                    "a reduced demo, or incomplete)"],
        "deviations": deviations(zero.low, zero.high),
    }
    path = write_family_record(protocol.registration_dir, record, settings.mode == "confirmatory")
    table = gates_table(gates, family_key).assign(record_json=json.dumps(record, sort_keys=True), record_path=str(path))
    context.log.info(f"registration record ({record['status']}) written to {path}; failed gates: "
                     f"{', '.join(record['failed_gates']) or 'none'}")
    return dg.Output(table, metadata={
        "record": str(path), "status": record["status"],
        "failed gates": ", ".join(record["failed_gates"]) or "none",
        "gates": dg.MetadataValue.md(table[["gate", "passed", "numbers", "message"]].to_markdown(index=False)),
        "depth band": ", ".join(band_keys(band)), "H5 depth": depth_key(record["h5_depth"]),
    })


@dg.asset_check(asset=registration_record, blocking=GATES_BLOCK, description=(
    "Appendix C step 4 (\"Register: submit as a Stage 1 Registered Report with the frozen bank hash, model "
    "manifest, analysis code and supplementary note hash\"), once steps 1-3 hold: every registration gate of the "
    "pilot passes (the record lists each with its numbers). Blocking in confirmatory mode; in pilot mode the "
    "failures travel with the analysis."))
def registration_gates(registration_record: pd.DataFrame) -> dg.AssetCheckResult:
    failed = registration_record[~registration_record["passed"].astype(bool)]
    return dg.AssetCheckResult(
        passed=failed.empty,
        description="every gate passes" if failed.empty else "failed: " + "; ".join(
            f"{r.gate}: {r.message}" for r in failed.itertuples()),
        metadata={"gates": dg.MetadataValue.md(registration_record[["gate", "passed", "numbers"]].to_markdown(index=False)),
                  "next step": "none" if failed.empty else
                  "fix each failed gate as its message says (frames, names, scorer rule, controls, power), re-run the "
                  "pilot assets it names, then registration_record; the confirmatory design is built only from a "
                  "registered record"})
