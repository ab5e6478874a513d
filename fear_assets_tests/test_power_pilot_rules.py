"""The power simulation's pilot estimates, by 6.3's rule "all fixed effects and variance
components at their pilot estimates" (issue 28 item 4): gate (b) from a recall pilot fit with
its own residual scale, gate (c)'s judge at the judge's pilot residual SD, H5's pilot fit
reading the content-removed trials, and the pilot's criterion cell effects and d' frame
correlations in the simulated forced choices. Each test builds the case that breaks the rule."""

from __future__ import annotations

import dataclasses

import arviz as az
import numpy as np
import pandas as pd
import pytest
from scipy.special import ndtri

from fear_assets.core.hashing import sampler_seed
from fear_assets.models.data import AGENTS, CONTENTS
from fear_assets.models.h5_model import H5Priors
from fear_assets.models.primary_model import Fitter, Priors
from fear_assets.simulation import models
from fear_assets.simulation.design import simulated_design
from fear_assets.simulation.generator import PilotEstimates, agent_effects, simulate_block, true_beta
from fear_assets.simulation.pilot_scales import NO_JUDGE, NO_RECALL, judge_note, pilot_judge_sigma, recall_pilot_fit
from fear_assets.simulation.runner import Rules, fit_dataset
from fear_assets_tests.test_power import _estimates
from fear_assets_tests.test_secondary_estimands import _fc_scores

CELLS = [(a, c) for a in AGENTS for c in CONTENTS]  # as the runner and analysis.confirmatory.h5 order them


def seed_of(settings, *purpose) -> int:
    """Every draw of these tests derives from the registered master seed, as the simulation's."""
    return sampler_seed(settings.master_seed, "test_power_pilot_rules", *purpose)


def quiet(sigma: float, **changes) -> PilotEstimates:
    """Report-fit estimates whose frame and unit SDs are negligible, so a generated block's
    spread about its fixed effects is its residual scale."""
    return dataclasses.replace(_estimates(sigma), frame_sd=(1e-6,) * 6, unit_sd=1e-6, **changes)


def residual_sd(d) -> float:
    """The SD of a generated block's outcome about its best fixed-effect fit (the design's X)."""
    X = np.column_stack([np.ones(len(d.y)), d.X])
    coef, *_ = np.linalg.lstsq(X, d.y, rcond=None)
    return float(np.std(d.y - X @ coef))


class CapturingFitter:
    """Stands in for the registered Fitter where only the generated data are under test: keeps
    every dataset it is handed and returns a small posterior of the primary model's shape."""

    draws, tune, chains = 20, 20, 2

    def __init__(self):
        self.fitted = []

    def fit(self, d, seed):
        self.fitted.append(d)
        rng = np.random.default_rng(seed)
        return az.from_dict(posterior={"beta": rng.normal(size=(2, 20, len(d.names))),
                                       "intercept": rng.normal(size=(2, 20))},
                            sample_stats={"diverging": np.zeros((2, 20), dtype=bool)})


# --- 1. gate (b) from a recall pilot fit -------------------------------------------------------
def test_gate_b_block_is_generated_at_the_recall_fits_residual_scale(settings):
    """A pilot whose recall Delta has 3x the report Delta's residual scale: the simulated gate
    (b) block has the recall scale (and nu), not the report's; without a recall fit it keeps
    the report's (the stated fallback)."""
    design = simulated_design(settings, ["d1"], ["d1"], 20, (0.2, 0.2), seed=seed_of(settings, "design"))
    report = quiet(0.05)
    recall = quiet(0.15, nu=5.0, intercept=0.4)
    rules = Rules.from_settings(settings)
    sd = {}
    for name, est in (("recall fit", dataclasses.replace(report, recall=recall.as_dict())), ("no recall", report)):
        fitter = CapturingFitter()
        rows = fit_dataset(fitter, design, est, rules, "f", "meaningful", 0, settings.master_seed, blocks=("recall",))
        assert [r["contrast"] for r in rows] == ["gate_b"]
        (d,) = fitter.fitted
        sd[name] = residual_sd(d)
    assert sd["recall fit"] == pytest.approx(models.pilot_residual_sd(recall), rel=0.15), sd
    assert sd["no recall"] == pytest.approx(models.pilot_residual_sd(report), rel=0.15), sd
    assert sd["recall fit"] > 2.5 * sd["no recall"]


def test_recall_pilot_fit_estimates_the_recall_outcomes_own_scale(settings):
    """6.3 on gate (b): the registered primary model fitted on the pilot's recall Delta. Pilot
    rows whose recall Delta is 3x as noisy as the report Delta give a recall sigma near the
    recall's, on the rows that have a recall Delta; the estimates are stored beside the
    report fit's and read back, and a record stored before them reads as no recall fit."""
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=seed_of(settings, "fit design"))
    rng = np.random.default_rng(seed_of(settings, "fit data"))
    d = design.data
    report, noisy = _estimates(0.1), _estimates(0.3)
    beta = true_beta(report, d, design.band, agent_effects(0.3))
    table = design.table.assign(delta=simulate_block(d, report, beta, 0.0, 1.0, rng).y,
                                delta_recall=simulate_block(d, noisy, beta, 0.0, 1.0, rng).y)
    table.loc[table.index[:4], "delta_recall"] = np.nan  # not read: these leave the recall fit
    fitter = Fitter(Priors.from_settings(settings), draws=150, tune=150, chains=2)
    fit = recall_pilot_fit(fitter, table, settings.fears, design.band, seed_of(settings, "recall fit"))
    assert fit.trials == len(table) - 4 and fit.max_rhat is not None
    got = PilotEstimates.from_dict(fit.estimates)
    assert 0.2 < got.sigma < 0.45, got.sigma  # the recall's 0.3, not the report's 0.1
    assert fit.note.startswith("the pilot's recall fit")
    stored = dataclasses.replace(report, recall=fit.estimates)
    assert PilotEstimates.from_dict(stored.as_dict()) == stored
    assert PilotEstimates.from_dict(report.as_dict()).recall is None and "recall" not in report.as_dict()


def test_a_pilot_without_recall_falls_back_to_the_report_fit_and_says_so(settings):
    design = simulated_design(settings, ["d1"], ["d1"], 5, (0.2, 0.2), seed=seed_of(settings, "design"))
    unread = design.table.assign(delta=0.0, delta_recall=np.nan)
    for table in (unread, design.table.assign(delta=0.0)):  # recall not read; no recall column at all
        fit = recall_pilot_fit(None, table, settings.fears, design.band, 0)  # no fit is attempted
        assert fit.estimates is None and fit.trials == 0 and fit.note.startswith(NO_RECALL)


# --- 2. the judge's sigma for gate (c) ---------------------------------------------------------
def test_judge_block_is_generated_at_the_judges_pilot_residual_sd(settings):
    """A judge whose pilot residual SD is 3x the tested model's: the stored estimates carry it
    (from pilot_controls, the value gate (c)'s analysis standardises the judge by) and the
    simulated judge outcome has the judge's scale; a pilot that scored no judge block keeps
    the tested model's scale and says so."""
    design = simulated_design(settings, ["d1"], ["d1"], 20, (0.2, 0.2), seed=seed_of(settings, "design"))
    tested = quiet(0.05)
    sigma_t = models.pilot_residual_sd(tested)
    controls = pd.DataFrame({"control": ["addressee_name", "marked_priority"], "pilot_sigma": [sigma_t] * 2,
                             "pilot_sigma_judge": [3 * sigma_t] * 2})
    judge_sigma = pilot_judge_sigma(controls)
    assert judge_sigma == pytest.approx(3 * sigma_t)
    est = PilotEstimates.from_dict(dataclasses.replace(tested, judge_sigma=judge_sigma).as_dict())
    assert est.judge_sigma == pytest.approx(3 * sigma_t)
    rng = np.random.default_rng(seed_of(settings, "judge"))
    beta = true_beta(est, design.data, design.band, agent_effects(0.3))
    _, frames = models.shared_primary(design, est, beta, 1.5, rng)
    judge = models.judge_table(design, est, frames, est.judge_sigma, 1.5, rng)
    generated = dataclasses.replace(design.data, y=judge["outcome"].to_numpy(float))
    assert residual_sd(generated) == pytest.approx(3 * sigma_t, rel=0.15)
    assert judge_note(judge_sigma).startswith("the judge's pilot residual SD")
    unscored = controls.assign(pilot_sigma_judge=np.nan)
    assert pilot_judge_sigma(unscored) is None and pilot_judge_sigma(controls.drop(columns="pilot_sigma_judge")) is None
    assert judge_note(None) == NO_JUDGE
    with pytest.raises(ValueError, match="judge sigmas"):
        pilot_judge_sigma(controls.assign(pilot_sigma_judge=[0.1, 0.2]))


# --- 3. and 4. H5's pilot fit with the content-removed trials; its criterion and correlations ---
@pytest.fixture(scope="module")
def h5_fits(settings):
    """H5's pilot fit (``h5_pilot_estimates`` on ``h5_pilot_rows``) without and with the
    content-removed baseline trials, on which the model nearly always chose option 1."""
    primary = _fc_scores(6, "d2", "pilot_primary", seed_of(settings, "h5 primary"))
    removed = _fc_scores(6, "d2", "pilot_content_removed", seed_of(settings, "h5 removed")).assign(fc_choice=1)
    removed.loc[removed.index[::10], "fc_choice"] = 2

    def fit(rows: pd.DataFrame) -> models.H5Estimates:
        return models.h5_pilot_estimates(rows, H5Priors.from_settings(settings), 150, 150, 2,
                                         seed_of(settings, "h5 fit"))

    return {"without": fit(models.h5_pilot_rows(primary, "d2")),
            "with": fit(models.h5_pilot_rows(primary, "d2", removed))}


def test_content_removed_trials_move_h5s_pilot_criterion(h5_fits):
    """4.5 / 6.1: the content-removed trials inform the criterion. Baseline trials on which the
    model chose option 1 nine times in ten shift the pilot's criterion intercept up (about
    Phi^-1(0.9) = 1.28 on those trials, against about zero on the primary trials' random choices)."""
    without, with_removed = h5_fits["without"].criterion_intercept, h5_fits["with"].criterion_intercept
    assert with_removed - without > 0.3, (without, with_removed)


def test_the_pilot_fits_criterion_cells_and_dprime_correlations_reach_the_simulated_choices(settings, h5_fits):
    """6.3: the criterion's cell effects and the d' frame correlations at their pilot
    estimates. The pilot fit's posterior means, stored and read back as the simulation reads
    them, are reproduced over many simulated frames: the content-removed choice rate of each
    cell follows the pilot's criterion cell effect, and the per-frame d' deviations have the
    pilot's correlation matrix and SDs x the inflation."""
    fitted = h5_fits["with"]
    assert len(fitted.criterion_cells) == len(CELLS) - 1 and np.shape(fitted.dprime_frame_corr) == (6, 6)
    stored = PilotEstimates.from_dict(dataclasses.replace(_estimates(), h5=fitted.as_dict()).as_dict())
    h5 = models.H5Estimates.from_dict(stored.h5)
    assert h5 == fitted
    # Planted where the small pilot is vague: distinct cell effects and strong correlations,
    # so reproducing them cannot happen by accident (a zeroed effect or an identity matrix).
    cells = (0.8, -0.6, 0.4, 0.0, -0.3)
    corr = np.full((6, 6), 0.6) + 0.4 * np.eye(6)
    corr[0, 1] = corr[1, 0] = -0.5
    corr = (corr + np.array(fitted.dprime_frame_corr)) / 2  # still a correlation matrix (convex mix)
    planted = dataclasses.replace(h5, criterion_intercept=0.2, position=0.0, criterion_frame_sd=0.0,
                                  criterion_cells=cells, dprime_frame_corr=tuple(map(tuple, corr)),
                                  dprime_frame_sd=(0.5,) * 6)
    rows = _fc_scores(300, "d2", "x", seed_of(settings, "h5 design"))
    rows = rows.assign(chose_option1=False, option1_first=True, frame=rows["item_id"])
    baseline = rows.assign(shown_option=0)
    sim = models.h5_table(baseline, CELLS, planted, 0.0, 1.5, np.random.default_rng(seed_of(settings, "h5 sim")))
    rate = sim.groupby(["agent", "content"])["chose_option1"].mean()
    effects = np.array([ndtri(rate[c]) for c in CELLS]) - planted.criterion_intercept
    np.testing.assert_allclose(effects, [*cells, -sum(cells)], atol=0.08)
    devs = models.h5_frame_deviations(planted, 6, 6000, 1.5, np.random.default_rng(seed_of(settings, "h5 devs")))
    np.testing.assert_allclose(np.corrcoef(devs.T), corr, atol=0.05)
    np.testing.assert_allclose(devs.std(axis=0), [0.75] * 6, rtol=0.05)
    # The fitted matrix itself (a posterior mean of LKJ draws) is usable as it stands.
    fitted_devs = models.h5_frame_deviations(h5, 6, 6000, 1.5, np.random.default_rng(seed_of(settings, "fitted")))
    np.testing.assert_allclose(np.corrcoef(fitted_devs.T), np.array(fitted.dprime_frame_corr), atol=0.05)


def test_a_batch_simulates_h5_at_the_pilots_registered_h5_depth(settings):
    """5 and 6.3: H5 is evaluated at one depth fixed from the pilot (the deepest with
    forced-choice accuracy in 0.60-0.90), and H5 is generated from its own model: the batch's
    design carries that depth to H5's simulated forced choices, not the band's deepest depth."""
    from fear_assets.core.registered import registered
    from fear_assets.simulation.steps import batch_design

    view = registered(settings, "qwen2.5-7b")
    est = PilotEstimates(intercept=0.0, beta={}, frame_sd=(), frame_corr=(), unit_sd=0.1, sigma=0.5, nu=10.0,
                         covariate_sd=(0.2, 0.2), controls={}, h5_depth="d3")
    design = batch_design(view, est, ("d5", "d6"), 10)
    assert design.h5_depth == "d3"
    assert set(models.h5_rows(design, design.h5_depth)["depth"]) == {"d3"}
    assert PilotEstimates.from_dict(est.as_dict()).h5_depth == "d3"
    # Estimates stored before the depth was recorded keep their JSON, and the band's deepest stands in.
    older = dataclasses.replace(est, h5_depth=None)
    assert "h5_depth" not in older.as_dict()
    assert batch_design(view, older, ("d5", "d6"), 10).h5_depth == "d6"
