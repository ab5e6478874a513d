"""The Stage 1 registration record of one configuration (Appendix C step 4, D6)."""

import dagster as dg
import pandas as pd

from fear_assets.core.settings import DepthBand, depth_key
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, named_metadata, table_metadata
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.registration import steps as registration_steps
from fear_assets.registration.gate_table import gate_rows, gates_of_table
from fear_assets.registration.gate_table import gates_summary as gate_summary


class RecordConfig(dg.Config):
    """Inputs the user provides at registration that are not registered settings."""

    #: The supplementary note's file (Declarations); "" = data/registration/supplementary_note.pdf.
    supplementary_note: str = ""


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "json"},
          ins={"power_summary": dg.AssetIn()})  # 6.3: the power gate comes before registration
def registration_record(context: dg.AssetExecutionContext, config: RecordConfig, protocol: ProtocolResource,
                        name_gate: pd.DataFrame,
                        model_manifest: pd.DataFrame, matched_frames: pd.DataFrame, zero_preference: pd.DataFrame,
                        binding_results: pd.DataFrame, report_scoring: pd.DataFrame, pilot_depths: pd.DataFrame,
                        pilot_controls: pd.DataFrame, pilot_probe_controls: pd.DataFrame,
                        power_summary: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Stage 1 registration record (Appendix C step 4): "frozen hashes (bank, settings,
    model manifest, analysis code, supplementary note), selected names and frames, depth band
    and H5 depth, the pilot sigmas for gate (c) (frozen: 6.2), every gate's outcome with its
    numbers", what is carried to the
    reading (in-context binding, the power result) and the stated deviations. Written as JSON
    and Markdown under data/registration/<family>/ (a draft in pilot mode, which
    ``fear register`` issues; once issued, confirmatory mode: rewritten only on the same
    frozen inputs with every gate passed, the power gate included, else refused);
    the confirmatory trial table reads it as an asset input, so a re-registration marks
    the confirmatory design and everything after it stale."""
    family_key = context.partition_key
    result = registration_steps.registration_record(
        protocol.view(family_key), protocol.bank(), name_gate, model_manifest, matched_frames,
        zero_preference, binding_results, report_scoring, pilot_depths, pilot_controls, pilot_probe_controls,
        power_summary, protocol.registration_dir, config.supplementary_note)
    record, path, table = result.record, result.path, result.table
    band = record["depth_band"]
    context.log.info(f"registration record ({record['status']}) written to {path}; failed gates: "
                     f"{', '.join(record['failed_gates']) or 'none'}")
    gates = record["gates"]
    return dg.Output(table, metadata=named_metadata(context, {
        "status": record["status"], "gates": gate_summary(gates),
        "gate table": table_metadata(gate_rows(gates)),
        "depth band": ", ".join(DepthBand.of(band).keys), "H5 depth": depth_key(record["h5_depth"]),
        "record": str(path),
    }))


@dg.asset_check(asset=registration_record, blocking=True, description=GATE_DESCRIPTION + (
    "Appendix C step 4 (\"Register: submit as a Stage 1 Registered Report with the frozen bank hash, model "
    "manifest, analysis code and supplementary note hash\"), once steps 1-3 hold: every registration gate of the "
    "pilot passes (the record lists each with its numbers). Blocking once the family's record is issued; in "
    "pilot mode the failures travel with the analysis."))
def registration_gates(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, registration_record: pd.DataFrame) -> dg.AssetCheckResult:
    failed = registration_steps.failed_gates(registration_record)
    gates = gates_of_table(registration_record)
    return gate_result(
        context, registration_record, passed=failed.empty,
        severity=gate_severity(protocol, context, registration_record), description=gate_summary(gates),
        metadata={"gate table": table_metadata(gate_rows(gates)),
                  "next step": "none" if failed.empty else
                  "each failed gate's fix (gate table), then registration_record again; the confirmatory design "
                  "is built only from a registered record"})
