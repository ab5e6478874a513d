"""The probe stage's steps (protocol 4.5 Branch 3, 6.1): one frame set's carriage probe with
its control probes, and the 6.1 control-probe rule as a check's verdict."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.probes.carriage import ProbeSettings, h4_interpretable, run_probes
from fear_assets.probes.inputs import PROBE_BLOCKS, probe_inputs


def probe_settings(view: Registered) -> ProbeSettings:
    """6.1's probe as registered: regularisation, clip, the controls' interval, the master seed."""
    p = view.probe
    return ProbeSettings(p.inverse_regularisation, p.clip, p.control_interval, view.master_seed)


@dataclass(frozen=True)
class ProbeResult:
    """One frame set's probe: held-out outputs and controls (None where its blocks were not
    scored), and how many frames it was trained across."""

    outputs: pd.DataFrame | None
    controls: pd.DataFrame | None
    frames: int = 0


def frame_set_probe(view: Registered, scores: pd.DataFrame, frame_set: str, n_jobs: int) -> ProbeResult:
    """The carriage probe of one frame set (6.1: "a linear probe on the residual stream, trained
    and tested across rotation folds"), every frame's three folds in parallel on ``n_jobs``
    cores, with the control probes and H4's interpretability flag; nothing where the frame
    set's probe blocks were not scored."""
    blocks = PROBE_BLOCKS[frame_set]
    if scores.empty or not scores["block"].isin(blocks[:2]).any():
        return ProbeResult(None, None)
    X, meta, Xna, na = probe_inputs(scores, blocks)
    out, ctrl = run_probes(X, meta, probe_settings(view), Xna, na, n_jobs=n_jobs)
    family_key = view.family.key
    ctrl = ctrl.assign(family=family_key, frame_set=frame_set, h4_interpretable=h4_interpretable(ctrl))
    return ProbeResult(out.assign(family=family_key, frame_set=frame_set), ctrl, int(meta["item_id"].nunique()))


def controls_off_chance(controls: pd.DataFrame) -> pd.DataFrame:
    """6.1: the control probes (every row but the probe itself) whose interval excludes 0.5;
    any such row makes H4 uninterpretable for the configuration."""
    return controls[(controls["probe"] != "probe") & controls["excludes_chance"]]


def at_chance_description(settings: ProtocolSettings) -> str:
    """The 6.1 control-probe check's description, with the registered interval."""
    return (f"Protocol 6.1: every control probe (cell+order+depth, order+depth, depth, shuffled labels, "
            f"no agent sentence) decodes at chance: its {settings.probe.control_interval:.0%} interval includes "
            "0.5. Otherwise H4 is uninterpretable for this configuration: a flag on H4's row, never blocking.")
