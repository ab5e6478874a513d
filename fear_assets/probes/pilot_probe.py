"""The pilot's carriage-probe rules (protocol 6.3): decoding at the shallowest depth and the
ceiling at the band depths, which declares H4 estimation-only before collection (6.1)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.pilot.depth_rules import stored_band
from fear_assets.probes.carriage import pilot_rules


def pilot_probe_controls(outputs: pd.DataFrame, controls: pd.DataFrame, pilot_depths: pd.DataFrame,
                         view: Registered) -> pd.DataFrame:
    """The pilot's control-probe table with the 6.3 pilot rules on the stored depth band."""
    band = stored_band(pilot_depths)
    rules = pilot_rules(outputs, shallowest=int(outputs["depth_index"].min()), band=list(band.indices),
                        ceiling=view.probe.ceiling_accuracy, level=view.probe.control_interval)
    return controls.assign(decodes_at_shallowest=rules["decodes_at_shallowest"],
                           band_mean_accuracy=rules["band_mean_accuracy"],
                           h4_estimation_only=rules["h4_estimation_only"], band_depths=band.stored)


@dataclass(frozen=True)
class PilotProbeVerdict:
    """The pilot probe rules read from the stored table: the verdict is decoding at the
    shallowest depth; the ceiling is a declaration about H4, never a failure (6.2)."""

    passed: bool
    description: str
    #: None where no pilot probe ran.
    row: pd.Series | None


def pilot_probe_verdict(pilot_probe_controls: pd.DataFrame) -> PilotProbeVerdict:
    """Whether the probe decodes at the shallowest depth, and what the ceiling declares."""
    pilot = pilot_probe_controls[pilot_probe_controls["probe"] == "probe"]
    if pilot.empty:
        return PilotProbeVerdict(False, "no pilot probe ran: score the pilot probe blocks first", None)
    row = pilot.iloc[0]
    passed = bool(row["decodes_at_shallowest"])
    what = []
    if not row["decodes_at_shallowest"]:
        what.append("the probe does not decode the option at the shallowest depth (99% interval includes 0.5)")
    if row["h4_estimation_only"]:
        what.append(f"mean accuracy at band depths {row['band_depths']} is {row['band_mean_accuracy']:.3f} > ceiling: "
                    "H4 is declared estimation-only before collection (carried to H4's row)")
    if passed and not what:
        what.append("decodes at the shallowest depth; below ceiling")
    elif passed:
        what.insert(0, "decodes at the shallowest depth")
    return PilotProbeVerdict(passed, "; ".join(what), row)


def pilot_probe_rules_description(settings: ProtocolSettings) -> str:
    """The pilot probe rules check's description, with the registered ceiling (6.3)."""
    return ("Protocol 6.3 pilot probe rules: the probe decodes the option at the shallowest depth (the "
            f"check's verdict); mean accuracy at the band depths above the ceiling ({settings.probe.ceiling_accuracy:g}) "
            "declares H4 estimation-only before collection (6.1), which the record carries to H4's row: reported "
            "here, never a failure, since H4 does not change the reading (6.2).")
