"""Pilot and confirmatory modes, per family (``registration.issue.family_mode``).

A family is in pilot mode until its registration record is issued (``fear register``), then
confirmatory. Dagster fixes a check's ``blocking`` flag when the definitions load, so every
registration gate is a blocking check, and the family's mode decides at run time whether
its failure blocks: Dagster stops the downstream steps only for a failed blocking check of
ERROR severity. Confirmatory: a failed gate has ERROR severity, so nothing downstream of it
runs. Pilot (the demo's): a failed gate is a WARN, the outputs downstream carry it
(``failed_gates``) and the run continues, so a family can run end to end while showing
honestly which gates it fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from fear_assets.core.numbers import is_missing, markdown_table, number, yes_no
from fear_assets.defs.metadata import partition_metadata
from fear_assets.defs.partitions import family_of_key
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.registration.issue import PILOT, gate_blocks

#: The sentence every registration gate's description starts with.
GATE_DESCRIPTION = "Registration gate (blocking after registration; advisory in pilot mode). "


def check_family(context: dg.AssetCheckExecutionContext | None, table=None) -> str | None:
    """The family a check runs for: the run's partition (its family part), else the checked
    table's ``family`` column (a check invoked directly); None where neither says."""
    if context is not None and context.has_partition_key:
        return family_of_key(context.partition_key)
    if table is not None and "family" in getattr(table, "columns", ()) and len(table):
        return str(table["family"].iloc[0])
    return None


def gate_severity(protocol: ProtocolResource, context: dg.AssetCheckExecutionContext | None, table=None,
                  stops: bool = True) -> dg.AssetCheckSeverity:
    """A registration gate's severity: ERROR (it blocks) only for a registered family and a
    verdict that stops (``registration.issue.gate_blocks``), WARN otherwise."""
    family = check_family(context, table)
    mode = protocol.mode(family) if family is not None else PILOT
    rehearsal = family is not None and protocol.rehearsal(family)
    return dg.AssetCheckSeverity.ERROR if gate_blocks(mode, stops, rehearsal) else dg.AssetCheckSeverity.WARN


def family_metadata(context, table=None) -> dict[str, str]:
    """The family and partition a check or asset ran for, as its first metadata entries (a
    check invoked directly names the checked table's family): with several families a failed
    gate's page says whose gate it is."""
    meta = dict(partition_metadata(context))
    family = check_family(context, table) if "family" not in meta else meta["family"]
    return {"family": family, **meta} if family is not None else meta


def readable_value(value: Any) -> Any:
    """A metadata value as a researcher reads it: flags as yes/no, a missing value as n/a,
    a float through ``core.numbers``, a mapping or list as ``key value`` text; Dagster
    metadata values, whole numbers and texts unchanged."""
    if isinstance(value, dg.MetadataValue):
        return value
    if isinstance(value, (bool, np.bool_)):
        return yes_no(value)
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {readable_value(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(readable_value(v)) for v in value) or "none"
    if is_missing(value):
        return "n/a"
    if isinstance(value, (float, np.floating)):
        return number(value, "value")
    if isinstance(value, np.integer):
        return int(value)
    return value


def named_metadata(context, metadata: Mapping[str, Any], table=None) -> dict[str, Any]:
    """``metadata`` led by the family and partition, every value readable (:func:`readable_value`)."""
    return {**family_metadata(context, table), **{k: readable_value(v) for k, v in metadata.items()}}


def gate_result(context, table=None, *, passed: bool, description: str, metadata: Mapping[str, Any] | None = None,
                **kwargs) -> dg.AssetCheckResult:
    """A check's result that names its family: the description starts with it and the
    metadata leads with the family and partition (:func:`named_metadata`)."""
    family = family_metadata(context, table).get("family")
    text = f"{family}: {description}" if family and not description.startswith(f"{family}:") else description
    return dg.AssetCheckResult(passed=passed, description=text,
                               metadata=named_metadata(context, metadata or {}, table), **kwargs)


def table_metadata(rows: pd.DataFrame) -> dg.MetadataValue:
    """A table of text cells (``core.numbers.formatted`` or a stage's presentation rows) as a
    Dagster table, every column a string column."""
    schema = dg.TableSchema(columns=[dg.TableColumn(str(c), "string") for c in rows.columns])
    records = [dg.TableRecord({str(k): str(v) for k, v in r.items()}) for r in rows.to_dict("records")]
    return dg.MetadataValue.table(records=records, schema=schema)


def md_table(table: pd.DataFrame, quantities: Mapping[str, Any] | None = None, index: bool = False,
             empty: str = "none") -> dg.MetadataValue:
    """A Markdown table of ``core.numbers.markdown_table`` cells (``index``: the table's index
    as its first columns); ``empty`` where it has no rows."""
    if not len(table):
        return dg.MetadataValue.md(empty)
    if index:
        table = table.reset_index()
    # A column of a grouped table is a tuple of levels: written as its words, never a tuple.
    table = table.set_axis([" ".join(str(x) for x in c if str(x)) if isinstance(c, tuple) else
                            ("" if str(c) == "index" else str(c)) for c in table.columns], axis=1)
    return dg.MetadataValue.md(markdown_table(table, quantities))
