"""The decision rule of protocol 6.2 (D5): one label per contrast from its HDI and the SESOI.

A pure function of numbers, fixed before any data are seen; the pilot, the analysis, the
power simulation and the reading all apply it through :func:`label`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Label = Literal["practically_equivalent", "supported", "contrary", "unresolved"]
H5Label = Literal["practically_equivalent", "supported", "contrary", "unresolved", "not_tested", "estimation_only"]
LABELS: tuple[str, ...] = ("practically_equivalent", "supported", "contrary", "unresolved")
#: A hypothesis declared estimation-only before collection (6.1 H4's ceiling; 6.3 a target
#: still missed at 100 frames): reported with its interval, never read through the rule, so
#: it can never enter the reading as Supported. For H5 it is D5 row 12's "estimation-only".
ESTIMATION_ONLY = "estimation_only"
#: A gate whose block or outcome was not scored has no label. It is not a 6.2 label, and it
#: can neither pass nor fail: see :func:`section8_reading`.
NOT_SCORED = "not_scored"
GATE_LABELS: tuple[str, ...] = (*LABELS, NOT_SCORED)
#: Carried by every reading until the power simulation (6.3) has run for the configuration.
POWER_GATE_NOT_RUN = "power_gate_not_run"


@dataclass(frozen=True)
class Decision:
    label: Label
    practically_meaningful: bool  # Supported with the whole HDI above the SESOI

    def __iter__(self):  # allows `label, meaningful = fear_assets.label(...)`
        return iter((self.label, self.practically_meaningful))


def label(hdi_low: float, hdi_high: float, sesoi: float) -> Decision:
    """One label per contrast, first match wins (6.2): Practically equivalent (99% HDI inside
    the ROPE of +-SESOI) > Supported (HDI wholly above 0; practically meaningful if wholly
    above the SESOI) > Contrary (wholly below 0) > Unresolved."""
    if not hdi_low <= hdi_high:
        raise ValueError(f"HDI bounds out of order: low {hdi_low} > high {hdi_high}; pass (low, high)")
    if sesoi <= 0:
        raise ValueError(f"SESOI must be positive, got {sesoi}; use the registered 0.15")
    if -sesoi < hdi_low and hdi_high < sesoi:
        return Decision("practically_equivalent", False)
    if hdi_low > 0:
        return Decision("supported", hdi_low > sesoi)
    if hdi_high < 0:
        return Decision("contrary", False)
    return Decision("unresolved", False)
