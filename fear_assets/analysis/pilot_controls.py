"""The pilot's positive controls (protocol 4.6, D4) and gate (c)'s pilot scale (6.2).

One step: the four controls fitted on the pilot frames at the band depths, and the residual
SD of the primary model fitted to the pilot over every pilot depth, per reader. It lives with
the analysis because it fits the analysis's control contrasts (``analysis.controls``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from fear_assets.analysis.controls import pilot_control_rows
from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.design.unmasking import unmask_pilot
from fear_assets.models.data import model_table
from fear_assets.models.fits import fit_cells
from fear_assets.models.primary_model import registered_fitter
from fear_assets.pilot.depth_rules import stored_band
from fear_assets.pilot.gate_c_scale import SIGMA_BLOCKS, reader_sigma, sigma_depths
from fear_assets.stimuli.bank import Bank


@dataclass(frozen=True)
class PilotControlsResult:
    """One row per control with gate (c)'s pilot sigma columns; the fitter's compilations."""

    table: pd.DataFrame
    sigma: float
    compilations: int


def pilot_controls(pilot_scores: pd.DataFrame, pilot_control_scores: pd.DataFrame, pilot_depths: pd.DataFrame,
                   assignment_key: pd.DataFrame, sentence_surprisal: pd.DataFrame,
                   judge_sentence_surprisal: pd.DataFrame, bank: Bank, view: Registered,
                   log: Callable[[str], None]) -> PilotControlsResult:
    """The four positive controls on the pilot frames averaged over the depth band (4.6, D4)
    and the trial-level residual SD gate (c) standardises each reader by (6.2): the tested
    model's over every pilot depth and, where a judge block is scored, the judge's with its
    own surprisals. Seeds: ``("pilot_controls", family, name)``."""
    settings, family_key = view.settings, view.family.key
    band = stored_band(pilot_depths).keys
    every = pd.concat([pilot_scores, pilot_control_scores], ignore_index=True)
    fears_of = {i: bank.item(i).group for i in set(every["item_id"])}

    def table(block: str, depths=None, surprisal: pd.DataFrame = sentence_surprisal) -> pd.DataFrame:
        rows = every[(every["block"] == block) & (every["depth"].isin(band if depths is None else depths))]
        return (model_table(unmask_pilot(rows, assignment_key), surprisal, fears_of, settings.neutral_partner_option)
                if len(rows) else rows)

    fitter = registered_fitter(view)
    seed = lambda name: view.seed("pilot_controls", family_key, name)  # noqa: E731
    # Gate (c)'s sigma per reader (6.2): its depths and statistic are decided in pilot/gate_c_scale.py.
    all_depths = sigma_depths(every.loc[every["block"] == SIGMA_BLOCKS["tested"], "depth"])
    sigma = reader_sigma(lambda t: fit_cells(fitter, t, settings.fears, band, seed("primary"),
                                             SIGMA_BLOCKS["tested"]).idata,
                         table(SIGMA_BLOCKS["tested"], all_depths), "tested")
    rule = view.positive_controls
    rows = pilot_control_rows(fitter, table, table("pilot_primary"), settings.fears, band, seed,
                              view.decision.hdi_prob, rule.pass_min_mean, rule.hdi_above, log)
    # Gate (c) standardises each reader by its own pilot residual SD: the judge's, where scored.
    judge = (table(SIGMA_BLOCKS["judge"], all_depths, judge_sentence_surprisal) if len(judge_sentence_surprisal)
             else pd.DataFrame())
    judge_sigma = reader_sigma(lambda t: fit_cells(fitter, t, settings.fears, band, seed("judge"),
                                                   SIGMA_BLOCKS["judge"]).idata, judge, "judge")
    result = pd.DataFrame(rows).assign(family=family_key, band_depths=",".join(band), pilot_sigma=sigma,
                                       pilot_sigma_judge=judge_sigma, pilot_sigma_depths=",".join(all_depths))
    return PilotControlsResult(result, sigma, fitter.compilations)


@dataclass(frozen=True)
class ControlsVerdict:
    """The positive-controls gate read from the stored table (4.6, D4)."""

    passed: bool
    description: str
    what_it_means: str


def controls_verdict(pilot_controls: pd.DataFrame) -> ControlsVerdict:
    """Every control passes, else which fail and why (a failing manipulation may be
    strengthened once before registration)."""
    bad = pilot_controls[~pilot_controls["passed"].astype(bool)]
    return ControlsVerdict(
        passed=bad.empty,
        description="all four controls pass" if bad.empty else
        "failing: " + "; ".join(f"{r.control} ({r.reason})" for r in bad.itertuples()) +
        ". Strengthen the failing manipulation once before registration (4.6); if a control fails in "
        "confirmatory data no Section 8 reading is made.",
        what_it_means="none" if bad.empty else
        "the protocol's manipulations do not move the model as predicted: without working controls "
        "no null on H2 can be read (D5 row 1)")


def controls_description(settings: ProtocolSettings) -> str:
    """The positive-controls check's description, with the registered pass rule (4.6, D4)."""
    rule = settings.positive_controls
    above = "zero" if rule.hdi_above == 0 else f"{rule.hdi_above:g}"
    return (f"Protocol 4.6 / D4: every positive control passes in the pilot (posterior mean >= {rule.pass_min_mean:g} "
            f"and {settings.decision.hdi_prob:.0%} HDI wholly above {above}). A failing control's manipulation may "
            "be strengthened once before registration.")
