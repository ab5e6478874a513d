"""Which family x depth partitions a family's design has (issue 15: backfills as users run them).

The partitions are a rectangle, family x d1..dN (Dagster's multi-partitions cannot be
ragged), while a family registers its own depths: the embedded family's reduced design has
two. A backfill over one family's depth partitions therefore also asks for depths the
design lacks. Those partitions are *not applicable*: the asset stores an empty slice with
this reason in its metadata, so the run ends green and the UI says why, instead of a
missing partition that reads as a failure. Pure: the registered settings in, a reason out.
"""

from __future__ import annotations

from typing import Iterable


def not_applicable(settings, family_key: str, depth: str, band: Iterable[str] | None = None) -> str | None:
    """Why the ``depth`` partition of ``family_key`` has nothing to build, or None when it has.

    ``band``, where given, is the registered depth band (pilot controls are scored only there,
    4.6 and Appendix C step 2)."""
    family = settings.family(family_key)
    if depth not in family.depth_keys:
        design = "reduced design" if family.reduced_design else "design"
        return (f"not applicable: the {design} of {family_key} registers depths {', '.join(family.depth_keys)} "
                f"only; {depth} is not part of it (nothing to build, not a failure)")
    if band is not None:
        band = sorted(band)
        if depth not in band:
            return (f"not applicable: {depth} is outside the depth band {', '.join(band)} of {family_key}; the pilot "
                    "controls are scored at the band depths only (not a failure)")
    return None
