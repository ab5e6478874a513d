"""The depth band and H5 depth (protocol 5) and the positive controls (4.6, D4) of the pilot."""

import dagster as dg
import pandas as pd

from fear_assets.analysis.controls import pilot_control_rows
from fear_assets.models.data import model_table
from fear_assets.models.fits import fit_cells
from fear_assets.analysis.unmasking import unmask_pilot
from fear_assets.defs.assets.steps import fitter as registered_fitter
from fear_assets.core.hashing import derived_seed
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.pilot.depth_rules import band_keys, depth_band, h5_depth, pooled_by_depth, stored_band
from fear_assets.pilot.gate_c_scale import SIGMA_BLOCKS, reader_sigma, sigma_depths
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.core.settings import depth_key

BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"},
          ins={"pilot_scores": BY_DEPTH})
def pilot_depths(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                 pilot_scores: pd.DataFrame, report_scoring: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Depth band (H1-H4) and H5 depth, named as depth indices (protocol 5), "from pilot
    frames only and pooled over all six cells" (no agent-by-content contrast is read): the
    band is the depths at which the generated report mentions the neutral partner on 20-80%
    of trials (else the two closest to 50%); the H5 depth is the deepest depth with pooled
    forced-choice accuracy in 0.60-0.90 (else the one closest to 0.75). A mention is the
    resolved outcome of 4.5 (``report_scoring``); refusals do not enter the rate."""
    settings = protocol.settings()
    by_depth = pooled_by_depth(pilot_scores, report_scoring)  # kept pilot trials only (4.8)
    rule, h5 = settings.depth_band_rule, settings.h5_depth_rule
    band, band_rule = depth_band(dict(zip(by_depth.depth_index, by_depth.neutral_mention_rate)),
                                 rule.neutral_mention_low, rule.neutral_mention_high, rule.min_depths,
                                 rule.fallback_target)
    h5_index, h5_rule = h5_depth(dict(zip(by_depth.depth_index, by_depth.fc_accuracy.astype(float))),
                                 h5.accuracy_low, h5.accuracy_high, h5.fallback_target)
    family = settings.family(context.partition_key)
    table = by_depth.assign(
        family=context.partition_key, depth=[depth_key(int(d)) for d in by_depth.depth_index],
        depth_tokens=[family.tokens_at(int(d)) for d in by_depth.depth_index],
        in_band=by_depth.depth_index.isin(band), is_h5_depth=by_depth.depth_index == h5_index,
        depth_band=",".join(map(str, band)), h5_depth=h5_index, band_rule=band_rule, h5_rule=h5_rule)
    return dg.Output(table, metadata={
        "depth band": ", ".join(band_keys(band)), "band rule": band_rule,
        "H5 depth": depth_key(h5_index), "H5 rule": h5_rule,
        "by depth": dg.MetadataValue.md(table[["depth", "depth_tokens", "trials", "answers", "refusals", "mentions",
                                               "neutral_mention_rate", "fc_accuracy", "in_band", "is_h5_depth"]]
                                        .round(3).to_markdown(index=False)),
    })


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "pymc"},
          ins={"pilot_scores": BY_DEPTH, "pilot_control_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
def pilot_controls(context: dg.AssetExecutionContext, protocol: ProtocolResource, pilot_scores: pd.DataFrame,
                   pilot_control_scores: pd.DataFrame, assignment_key: pd.DataFrame,
                   sentence_surprisal: pd.DataFrame, judge_sentence_surprisal: pd.DataFrame,
                   pilot_depths: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The four positive controls on the pilot frames (4.6, D4), "each contrast signed so the
    predicted direction is positive and averaged over the depth band": the primary model is
    fitted once on the control cells together with the matched primary cells, with a
    condition factor and its interactions and shared frame effects (the addressee control,
    whose contrast lies within its own cells, is fitted on them). A control passes with
    posterior mean >= 0.15 and its 99% HDI wholly above zero; a failing control may be
    strengthened once before registration. Also records gate (c)'s scale (6.2): the
    trial-level residual SD implied by the primary model fitted to the pilot over all pilot
    depths, for the tested model and, where scored, the judge (with its own surprisals)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    band = band_keys(stored_band(pilot_depths))
    every = pd.concat([pilot_scores, pilot_control_scores], ignore_index=True)
    fears_of = {i: bank.item(i).group for i in set(every["item_id"])}

    def table(block: str, depths=None, surprisal: pd.DataFrame = sentence_surprisal) -> pd.DataFrame:
        rows = every[(every["block"] == block) & (every["depth"].isin(band if depths is None else depths))]
        return (model_table(unmask_pilot(rows, assignment_key), surprisal, fears_of, settings.neutral_partner_option)
                if len(rows) else rows)

    fitter = registered_fitter(settings)
    seed = lambda name: derived_seed(settings.master_seed, "pilot_controls", family_key, name) % (2**31)
    # Gate (c)'s sigma per reader (6.2): its depths and statistic are decided in pilot/gate_c_scale.py.
    all_depths = sigma_depths(every.loc[every["block"] == SIGMA_BLOCKS["tested"], "depth"])
    sigma = reader_sigma(lambda t: fit_cells(fitter, t, settings.fears, band, seed("primary"),
                                             SIGMA_BLOCKS["tested"]).idata,
                         table(SIGMA_BLOCKS["tested"], all_depths), "tested")
    rule = settings.positive_controls
    rows = pilot_control_rows(fitter, table, table("pilot_primary"), settings.fears, band, seed,
                              settings.decision.hdi_prob, rule.pass_min_mean, rule.hdi_above, context.log.info)
    # Gate (c) standardises each reader by its own pilot residual SD: the judge's, where scored.
    judge = (table(SIGMA_BLOCKS["judge"], all_depths, judge_sentence_surprisal) if len(judge_sentence_surprisal)
             else pd.DataFrame())
    judge_sigma = reader_sigma(lambda t: fit_cells(fitter, t, settings.fears, band, seed("judge"),
                                                   SIGMA_BLOCKS["judge"]).idata, judge, "judge")
    result = pd.DataFrame(rows).assign(family=family_key, band_depths=",".join(band), pilot_sigma=sigma,
                                       pilot_sigma_judge=judge_sigma, pilot_sigma_depths=",".join(all_depths))
    return dg.Output(result, metadata={
        "controls": dg.MetadataValue.md(result[["control", "mean", "hdi_low", "hdi_high", "passed", "reason"]]
                                        .round(3).to_markdown(index=False)),
        "pilot sigma (gate (c) scale; SD implied by the Student-t fit, all pilot depths)": round(sigma, 4),
        # How many model shapes this step compiled (others reused from an earlier step of the
        # process): run metadata, not part of the stored table, which is the same either way.
        "model compilations": fitter.compilations,
    })


@dg.asset_check(asset=pilot_controls, blocking=GATES_BLOCK, description=(
    "Protocol 4.6 / D4: every positive control passes in the pilot (posterior mean >= 0.15 "
    "and 99% HDI wholly above zero). A failing control's manipulation may be strengthened "
    "once before registration."))
def positive_controls_pass(pilot_controls: pd.DataFrame) -> dg.AssetCheckResult:
    bad = pilot_controls[~pilot_controls["passed"].astype(bool)]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="all four controls pass" if bad.empty else
        "failing: " + "; ".join(f"{r.control} ({r.reason})" for r in bad.itertuples()) +
        ". Strengthen the failing manipulation once before registration (4.6); if a control fails in "
        "confirmatory data no Section 8 reading is made.",
        metadata={"controls": dg.MetadataValue.md(pilot_controls[["control", "mean", "hdi_low", "hdi_high", "passed"]]
                                                  .round(3).to_markdown(index=False)),
                  "what it means": "none" if bad.empty else
                  "the protocol's manipulations do not move the model as predicted: without working controls "
                  "no null on H2 can be read (D5 row 1)"})
