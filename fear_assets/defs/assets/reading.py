"""Stage "reading" (protocol 6.2, 8; D5): the Section 8 reading of each configuration and
the cross-family statement."""

import dagster as dg
import pandas as pd

from fear_assets.core.numbers import yes_no
from fear_assets.defs.metadata import partition_metadata
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.reading.steps import cross_family, family_reading, labels_table
from fear_assets.defs.resources.protocol import ProtocolResource

@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"})
def section8_reading(context: dg.AssetExecutionContext, posteriors: pd.DataFrame,
                     registration_record: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Section 8 reading of one configuration (D5 Table 8): "a pure function of the
    labels of H2, H5 and gates (a)-(c) and the flags (controls, binding, power)", with the
    qualifiers the protocol requires and every flag the analysis carries (failed pilot gates,
    non-converged contrasts, pilot-only data, stand-ins). The cross-family statement is
    ``cross_family_statement``."""
    meta = partition_metadata(context)
    family = meta.get("family", str(context.partition_key))
    result = family_reading(family, posteriors, registration_record)
    reading = result.reading
    context.log.info(f"Section 8 reading for {family}: {reading.code} (row {reading.row})")
    return dg.Output(result.table, metadata={
        **meta, "reading": f"{family}: {reading.code} (D5 row {reading.row})",
        "labels": dg.MetadataValue.md(labels_table(result.labels, posteriors).to_markdown(
            index=False, disable_numparse=True)),
        "descriptive only": yes_no(reading.descriptive_only),
        "qualifiers": "; ".join(reading.qualifiers) or "none", "flags": "; ".join(result.flags) or "none"})


@dg.asset(kinds={"duckdb", "python"}, ins={"section8_reading": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
def cross_family_statement(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                           section8_reading: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """6.2: "a statement about current language models in general requires the same label on
    H2 in all three families" (the embedded demo family does not count); until each has a
    reading, none is made, and a family whose reading is row 1 or 2 of D5 has no H2 label to
    enter it. A pooled estimate would be descriptive only."""
    result = cross_family(section8_reading, protocol.settings().families)
    return dg.Output(result.table, metadata={"statement": result.statement})
