"""The independent auditor (standard library only; shares no code with the generator).

It reads only the planned rows (the bodies as text), rebuilds each world's graph from the
records, and proves or checks every property the protocol claims for them.
"""

from renaming_assets.auditor.report import audit_family, audit_plan, audit_schedule, combine

__all__ = ["audit_family", "audit_plan", "audit_schedule", "combine"]
