"""Stage "reading" (protocol 6.2, 8; D5): the Section 8 reading of each configuration and
the cross-family statement."""

import json

import dagster as dg
import pandas as pd

from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.reading.decision import section8_reading as decide
from fear_assets.reading.inputs import cross_family_statement as cross_family_statement_of
from fear_assets.reading.inputs import reading_flags, reading_inputs
from fear_assets.defs.resources.protocol import ProtocolResource

#: The reading's fields that come straight from its inputs.
LABELS = ("h2", "h5", "gate_a", "gate_b", "gate_c")


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"})
def section8_reading(context: dg.AssetExecutionContext, posteriors: pd.DataFrame,
                     registration_record: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Section 8 reading of one configuration (D5 Table 8): "a pure function of the
    labels of H2, H5 and gates (a)-(c) and the flags (controls, binding, power)", with the
    qualifiers the protocol requires and every flag the analysis carries (failed pilot gates,
    non-converged contrasts, pilot-only data, stand-ins). The cross-family statement is
    ``cross_family_statement``."""
    record = json.loads(registration_record["record_json"].iloc[0])
    args = reading_inputs(posteriors, record)
    reading = decide(**{k: v for k, v in args.items() if k != "in_context"})
    flags = reading_flags(reading, args, posteriors)
    row = {"family": context.partition_key, "code": reading.code, "row": reading.row,
           "qualifiers": "; ".join(reading.qualifiers), "descriptive_only": reading.descriptive_only,
           **{k: args[k] for k in LABELS},
           "controls_failed": args["controls_failed"], "binding_failed": args["binding_failed"],
           "binding_in_context": args["in_context"], "h2_meaningful": args["h2_meaningful"],
           "gates_underpowered": "not run" if args["gates_underpowered"] is None else str(args["gates_underpowered"]),
           "gates_not_scored": ",".join(reading.not_scored_gates), "flags": "; ".join(flags)}
    context.log.info(f"Section 8 reading for {context.partition_key}: {reading.code} (row {reading.row})")
    return dg.Output(pd.DataFrame([row]), metadata={
        "reading": f"{reading.code} (D5 row {reading.row})",
        "labels": ", ".join(f"{k} {args[k]}" for k in LABELS),
        "qualifiers": "; ".join(reading.qualifiers) or "none", "flags": "; ".join(flags) or "none"})


@dg.asset(kinds={"duckdb", "python"}, ins={"section8_reading": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
def cross_family_statement(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                           section8_reading: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.2: "a statement about current language models in general requires the same label on
    H2 in all three families" (the embedded demo family does not count); until each has a
    reading, none is made, and a family whose reading is row 1 or 2 of D5 has no H2 label to
    enter it. A pooled estimate would be descriptive only."""
    settings = protocol.settings()
    registered = [k for k, f in settings.families.items() if f.role in ("primary", "replication")]
    result = cross_family_statement_of(section8_reading, registered)
    table = pd.DataFrame([{"families": json.dumps(result.labels), "missing": ", ".join(result.missing),
                           "descriptive_only": json.dumps(result.descriptive), "statement": result.statement}])
    return dg.Output(table, metadata={"statement": result.statement})
