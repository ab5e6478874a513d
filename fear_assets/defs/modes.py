"""Pilot and confirmatory modes (registered under protocol.mode).

``confirmatory``: every registration gate is a blocking asset check, so nothing downstream
of a failed gate runs. ``pilot`` (the demo's mode): gates record their failure, the outputs
downstream carry it (``failed_gates``), and the run continues, so a family can run end to
end while showing honestly which gates it fails. Dagster fixes a check's blocking flag when
the definitions load, so it comes from the definition-time layout (``partitions.LAYOUT``).
"""

from fear_assets.defs.partitions import LAYOUT

GATES_BLOCK = LAYOUT.gates_block
MODE = "confirmatory" if GATES_BLOCK else "pilot"
