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

import dagster as dg

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
    return dg.AssetCheckSeverity.ERROR if gate_blocks(mode, stops) else dg.AssetCheckSeverity.WARN
