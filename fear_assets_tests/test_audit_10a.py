"""Issue 10, part A: registered-rule corrections in the analysis models (protocol 4.6, 4.8,
5, 6.1-6.2; DECISIONS 3, 3b, 4). Each test fails on the code before the correction."""

import itertools

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytest
import xarray as xr

from fear_assets.analysis.controls import fit_control, priority_contrast
from fear_assets.models.data import covariate_centres, kept, model_table, prepared
from fear_assets.models.exclusions import exclusion_rates
from fear_assets.models.fits import fit_cells
from fear_assets.analysis.gate_c import GateCPriors, build_gate_c_model, gate_c_decision, prepare_gate_c
from fear_assets.models.joint import JointData
from fear_assets.models.primary_model import (Fitter, MissingBandDepthError, MissingCovariateError, Priors,
                                                ResidualSDNotFiniteError, build_model, cell_means,
                                                implied_residual_sd, prepare)

FEARS = ["termination", "uncertainty", "isolation", "inferiority", "identity_loss"]
CELLS = list(itertools.product(("self", "peer", "person"), ("threat", "harmless")))


def levels(depths=("d1", "d2")):
    return {"agent": ["self", "peer", "person"], "content": ["threat", "harmless"], "depth": list(depths),
            "order": [1, 2], "option": [1, 2], "rotation": [1, 2, 3], "fear": FEARS}


def simulate(frames=3, depths=("d1", "d2"), seed=0, frame_sd=0.0, shift=0.0, frame_effects=None, noise=0.1):
    """A model table: each frame's intercept from ``frame_effects`` (else Normal(0, frame_sd)),
    ``shift`` added to every cell (a priority control's effect), Normal(0, noise) residuals."""
    rng = np.random.default_rng(seed)
    effects = frame_effects if frame_effects is not None else rng.normal(0, frame_sd, frames)
    rows = []
    for f, rot, order, depth in itertools.product(range(frames), (1, 2, 3), (1, 2), depths):
        for cell, (agent, content) in enumerate(CELLS, start=1):
            option = 1 if (rot + 3 * (order - 1) + int(depth[1:]) + cell) % 2 == 0 else 2
            rows.append({"agent": agent, "content": content, "depth": depth, "order": order, "option": option,
                         "rotation": rot, "fear": FEARS[f % 5], "frame": f"F{f}", "item_id": f"F{f}",
                         "unit": f"F{f}|r{rot}|o{order}|{depth}", "surprisal_name": rng.normal(0, 0.1),
                         "surprisal_rest": rng.normal(0, 0.1),
                         "outcome": effects[f] + shift + rng.normal(0, noise)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------
# Item 1: gate (c)'s joint model has the primary model's full random-effects structure
# ---------------------------------------------------------------------------------------
def _normal_sd(var) -> float:
    return float(np.unique(var.owner.inputs[-1].eval()).item())


def test_audit_gate_c_frame_slopes(settings):
    data = pd.concat([simulate(frames=2).assign(reader="tested"), simulate(frames=2, seed=1).assign(reader="judge")],
                     ignore_index=True)
    priors = GateCPriors.from_settings(settings)
    d = prepare_gate_c(data, levels(), {"tested": 0.3, "judge": 0.6}, priors.reader_factor_sd, outcome="outcome")
    model = build_gate_c_model(d, priors)
    primary = build_model(prepare(simulate(frames=2).assign(delta=lambda x: x.outcome), levels()), priors.base)
    # The same random effects as the primary model: frame intercept + agent (2) + content (1)
    # + agent x content (2) slopes, correlated (LKJ Cholesky), and a unit intercept.
    for name in ("frame_chol", "z_frame", "frame_effects", "unit_sd", "z_unit"):
        assert name in model.named_vars and name in primary.named_vars
    assert model["z_frame"].type.shape == (2, 6) or tuple(model["z_frame"].shape.eval()) == (2, 6)
    frames = pm.draw(model["frame_effects"], draws=400, random_seed=3)
    assert frames.shape == (400, 2, 6) and np.all(frames.std(axis=0) > 0.05)
    # LKJ(2) correlations and half-Normal(0, 0.5) scales, as registered: for a 6-dimensional
    # LKJ(eta) each correlation is 2 Beta(eta - 1 + 3, same) - 1, sd 1/sqrt(2 (eta + 2) + 1).
    corr, stds = pm.draw([model["frame_chol_corr"], model["frame_chol_stds"]], draws=4000, random_seed=5)
    eta = settings.priors.lkj_eta
    assert corr[:, 0, 1].std() == pytest.approx(1 / np.sqrt(2 * (eta + 2) + 1), rel=0.05)
    assert stds.mean() == pytest.approx(settings.priors.group_sd_halfnormal * np.sqrt(2 / np.pi), rel=0.05)
    # Reader factor Normal(0, 0.5); one residual scale per reader.
    assert _normal_sd(model["block_beta"]) == settings.priors.gate_c_reader_factor_sd == 0.5
    sigma = pm.draw(model["sigma"], draws=2000, random_seed=4)
    assert sigma.shape == (2000, 2)
    assert abs(sigma.mean() - 0.5 * np.sqrt(2 / np.pi)) < 0.02  # half-Normal(0, 0.5)
    # The same frame-effect prior as the primary model (drawn from both models, not read off
    # their source): scales and correlations agree in distribution.
    p_corr, p_stds = pm.draw([primary["frame_chol_corr"], primary["frame_chol_stds"]], draws=4000, random_seed=6)
    assert np.quantile(stds, [0.25, 0.5, 0.75]) == pytest.approx(np.quantile(p_stds, [0.25, 0.5, 0.75]), rel=0.08)
    assert corr[:, 0, 1].std() == pytest.approx(p_corr[:, 0, 1].std(), rel=0.08)
    # Each trial's mu carries its frame's intercept, agent, content and agent x content slopes
    # (shared by both readers) and, per reader, that frame's deviation of the agent x content
    # slopes, + for the tested reader and - for the judge: set the frame effects, switch every
    # other term off, and the model's outcome is exactly that sum.
    rng = np.random.default_rng(0)
    shared, deviation = rng.normal(size=(2, 6)), rng.normal(size=(2, 2))
    fixed = pm.do(model, {"frame_effects": shared, "block_frame_effects": deviation, "intercept": 0.0,
                          "beta": np.zeros(len(d.names)), "block_beta": np.zeros(len(d.w_names)), "unit_sd": 0.0,
                          "sigma": np.full(2, 1e-9), "nu": 1e6})
    y = pm.draw(fixed["y_obs"], random_seed=1)
    sign = np.where(data.reader.to_numpy() == "tested", 1.0, -1.0)
    agent_content = sign[:, None] * np.column_stack(
        [(data.agent == a).to_numpy(float) - (data.agent == "person").to_numpy(float) for a in ("self", "peer")]) \
        * np.where(data.content.to_numpy() == "threat", 1.0, -1.0)[:, None]
    np.testing.assert_allclose(y, (d.Z * shared[d.frame]).sum(axis=1)
                               + (agent_content * deviation[d.frame]).sum(axis=1), atol=1e-6)
    # The added deviations' prior is the registered one for a random effect: half-Normal(0, 0.5)
    # scales and an LKJ(2) correlation (2 x 2: r = 2 Beta(eta, eta) - 1, sd 1/sqrt(2 eta + 1)).
    dev_corr, dev_stds = pm.draw([model["block_frame_chol_corr"], model["block_frame_chol_stds"]], draws=4000,
                                 random_seed=7)
    assert dev_stds.mean() == pytest.approx(settings.priors.group_sd_halfnormal * np.sqrt(2 / np.pi),
                                            rel=0.05)
    assert dev_corr[:, 0, 1].std() == pytest.approx(1 / np.sqrt(2 * eta + 1), rel=0.05)


def test_audit_gate_c_meaningful_is_hdi_beyond_the_rope(settings):
    sesoi, meaningful = settings.decision.sesoi, settings.decision.meaningful
    sigma = 0.5  # ROPE +-0.30, meaningful size 0.60 on the standardised scale
    between = gate_c_decision(0.40, 0.90, sigma, sesoi, meaningful)
    assert between.label == "supported" and between.practically_meaningful  # beyond the ROPE, below 0.60
    inside = gate_c_decision(0.10, 0.90, sigma, sesoi, meaningful)
    assert inside.label == "supported" and not inside.practically_meaningful


# ---------------------------------------------------------------------------------------
# Gate (c)'s sigma: the SD implied by the Student-t fit
# ---------------------------------------------------------------------------------------
def _idata(sigma, nu):
    post = xr.Dataset({"sigma": (("chain", "draw"), np.asarray(sigma, float).reshape(1, -1)),
                       "nu": (("chain", "draw"), np.asarray(nu, float).reshape(1, -1))})
    return az.InferenceData(posterior=post)


def test_audit_gate_c_sigma_is_the_implied_residual_sd():
    sigma, nu = np.full(5, 0.4), np.array([3.0, 4.0, 5.0, 6.0, 10.0])
    want = np.median(0.4 * np.sqrt(nu / (nu - 2)))
    assert implied_residual_sd(_idata(sigma, nu)) == pytest.approx(want)
    assert implied_residual_sd(_idata(sigma, nu)) > 0.4  # not the scale itself
    # nu <= 2 on a minority of draws: counted as infinite, the median stays finite.
    assert np.isfinite(implied_residual_sd(_idata(sigma, [1.5, 4.0, 5.0, 6.0, 10.0])))
    with pytest.raises(ResidualSDNotFiniteError, match="nu <= 2"):
        implied_residual_sd(_idata(sigma, [1.5, 1.8, 1.9, 6.0, 10.0]))


# ---------------------------------------------------------------------------------------
# Item 2: a positive control is one fit over the control and the matched primary cells
# ---------------------------------------------------------------------------------------
class RecordingFitter(Fitter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def fit(self, d, seed, fixed_sd=None):
        self.seen.append(d)
        return super().fit(d, seed, fixed_sd)


class StubFitter:
    """Records what it is asked to fit and returns a posterior whose block factor is a known
    constant: the control cells sit ``shift`` above the primary cells."""

    def __init__(self, priors, shift):
        self.priors, self.shift, self.seen = priors, shift, []

    def fit(self, d, seed, fixed_sd=None):
        self.seen.append(d)
        rng = np.random.default_rng(seed)
        n = (2, 50)
        block_beta = np.zeros((*n, d.W.shape[1] if hasattr(d, "W") else 1))
        block_beta[..., 0] = self.shift / 2  # sum coding: control +shift/2, primary -shift/2
        post = xr.Dataset({"intercept": (("chain", "draw"), rng.normal(0, 1, n)),
                           "beta": (("chain", "draw", "fixed"), rng.normal(0, 1, (*n, d.X.shape[1]))),
                           "block_beta": (("chain", "draw", "block_fixed"), block_beta),
                           "sigma": (("chain", "draw"), np.abs(rng.normal(0.5, 0.01, n))),
                           "nu": (("chain", "draw"), np.abs(rng.normal(20, 1, n)))})
        stats = xr.Dataset({"diverging": (("chain", "draw"), np.zeros(n, bool))})
        return az.InferenceData(posterior=post, sample_stats=stats)


def test_audit_positive_controls_one_joint_fit(settings):
    """Each of controls 2-4 is ONE fit over the control cells and the matched primary cells
    (a condition factor and its interactions, the frame effects shared); the contrast is read
    from that posterior. The former rule fitted two posteriors and subtracted their means."""
    primary = simulate(frames=2, depths=("d1", "d2"), seed=5)
    control = simulate(frames=2, depths=("d1",), shift=0.4, seed=6)
    stub = StubFitter(Priors.from_settings(settings), shift=0.4)
    fit = fit_control(stub, "instructed_priority", control, primary, FEARS, ["d1"], seed=7)
    assert len(stub.seen) == 1 and isinstance(stub.seen[0], JointData)
    d = stub.seen[0]
    assert d.blocks == ("control", "primary") and d.factor == "condition" and d.n_frames == 2
    # Matched primary cells only: the control's frames and depths (d2 is left out).
    assert fit.rows == 2 * len(control) and set(d.block) == {0, 1}
    assert d.Z.shape[1] == 6 and not d.per_block_sigma and d.factor_sd == settings.priors.fixed_effect_sd
    assert d.w_names[0] == "condition[control]" and len(d.w_names) == 1 + 2 + 1 + 2  # 1, agent, content, a x c
    # The priority contrast is exactly the condition effect here (draw by draw, one posterior).
    np.testing.assert_allclose(fit.draws, 0.4)
    # The addressee control is its own cells' fit (its agents never occur in primary cells).
    addressee = simulate(frames=2, depths=("d1",), seed=8).replace(
        {"agent": {"self": "addressee", "peer": "other_person", "person": "other_person"}})
    stub = StubFitter(Priors.from_settings(settings), shift=0.0)
    fit_control(stub, "addressee_name", addressee.drop(columns=["surprisal_name", "surprisal_rest"]), primary,
                FEARS, ["d1"], seed=9)
    assert len(stub.seen) == 1 and not isinstance(stub.seen[0], JointData) and stub.seen[0].covariates == ()


@pytest.mark.slow
def test_audit_positive_controls_paired_frames(settings):
    """Large frame intercepts shared by the control and primary cells: one joint fit pairs
    them, so the priority contrast's HDI is far narrower than the difference of two
    separate fits' band means (the former rule), and it still covers the true shift."""
    effects = np.array([-1.2, 1.2])
    primary = simulate(frames=2, depths=("d1",), frame_effects=effects, seed=5)
    control = simulate(frames=2, depths=("d1",), frame_effects=effects, shift=0.4, seed=6)
    fitter = RecordingFitter(Priors.from_settings(settings), draws=300, tune=400, chains=2)
    fit = fit_control(fitter, "instructed_priority", control, primary, FEARS, ["d1"], seed=7)
    assert len(fitter.seen) == 1 and isinstance(fitter.seen[0], JointData)
    d = fitter.seen[0]
    assert d.blocks == ("control", "primary") and d.n_frames == 2 and set(d.block) == {0, 1}
    assert d.Z.shape[1] == 6 and fit.rows == len(control) + len(primary)
    hdi = settings.decision.hdi_prob
    low, high = az.hdi(fit.draws, hdi_prob=hdi)
    assert low < 0.4 < high and low > 0.0
    # The former rule: two posteriors, band means subtracted draw by draw.
    a = fit_cells(fitter, control, FEARS, ["d1"], 8, "control")
    b = fit_cells(fitter, primary, FEARS, ["d1"], 9, "primary")
    old_low, old_high = az.hdi(priority_contrast(a.mu, b.mu), hdi_prob=hdi)
    assert (high - low) < 0.5 * (old_high - old_low)


# ---------------------------------------------------------------------------------------
# Item 5: truncated answers are excluded from every analysis and counted per cell
# ---------------------------------------------------------------------------------------
def _scores(n_truncated=2, n_context=1):
    rows = []
    for i, (agent, content) in enumerate(CELLS * 2):
        rows.append({"trial_id": f"t{i}", "block": "pilot_primary", "block_kind": "agent", "agent": agent,
                     "content": content, "depth": "d1", "item_id": "TER-01", "rotation": 1, "order": 1 + i // 6,
                     "content_option": 1, "delta": 0.1 * i, "excluded_context": False,
                     "generation_truncated": False, "answer_exceeds_context": False})
    scores = pd.DataFrame(rows)
    scores.loc[:n_truncated - 1, "generation_truncated"] = True
    scores.loc[len(scores) - n_context:, "excluded_context"] = True
    scores.loc[len(scores) - n_context:, "delta"] = np.nan
    return scores


def _surprisal():
    rows = []
    for rotation, (agent, content), option in itertools.product((1, 2, 3), CELLS, (1, 2)):
        rows.append({"item_id": "TER-01", "rotation": rotation, "agent": agent, "content": content, "option": option,
                     "name_nll": 2.0 + 0.1 * option + (agent == "self"), "rest_nll": 3.0 + 0.05 * rotation})
    for rotation, option in itertools.product((1, 2, 3), (1, 2)):
        rows.append({"item_id": "TER-01", "rotation": rotation, "agent": "partner", "content": "partner",
                     "option": option, "name_nll": np.nan, "rest_nll": 2.5})
    return pd.DataFrame(rows)


def test_audit_truncated_answers_are_dropped_and_counted():
    scores = _scores(n_truncated=2, n_context=1)
    table = model_table(scores, _surprisal(), {"TER-01": "termination"}, 1)
    assert len(table) == len(scores) - 3
    assert not table["generation_truncated"].any() and not table["excluded_context"].any()
    assert len(kept(scores)) == len(scores) - 3
    rates = exclusion_rates(scores, flag_rate=0.05).set_index(["agent", "content"])
    assert rates.loc[("self", "threat"), "generation_truncated"] == 1
    assert rates.loc[("self", "harmless"), "generation_truncated"] == 1
    assert rates.loc[("person", "harmless"), "excluded_context"] == 1
    assert rates["excluded"].sum() == 3 and rates["answer_exceeds_context"].sum() == 0
    assert rates.loc[("self", "threat"), "flagged"]


# ---------------------------------------------------------------------------------------
# Minor: covariates centred on their bank means; missing covariates fail loudly
# ---------------------------------------------------------------------------------------
def test_audit_covariates_bank_means_and_missing_values_fail():
    surprisal = _surprisal()
    scores = _scores(n_truncated=0, n_context=0)
    centres = covariate_centres(surprisal, 1)
    table = model_table(scores, surprisal, {"TER-01": "termination"}, 1)
    # Bank mean: over every agent sentence of the surprisal table, not over the fitted rows.
    agent = surprisal[surprisal.agent != "partner"]
    assert centres["surprisal_name"] == pytest.approx(agent.name_nll.mean())
    assert centres["surprisal_rest"] == pytest.approx((agent.rest_nll - 2.5).mean())
    raw_name = 2.0 + 0.1 * 1 + (table["agent"] == "self")
    np.testing.assert_allclose(table["surprisal_name"], raw_name - centres["surprisal_name"])
    assert abs(table["surprisal_name"].mean()) > 1e-3  # the fitted rows are not re-centred
    d = prepared(table, {**levels(("d1",)), "order": [1, 2], "rotation": [1], "option": [1]})
    np.testing.assert_allclose(d.X[:, d.names.index("surprisal_name")], table["surprisal_name"])
    # A trial whose sentence has no surprisal: a named error, never a silent drop.
    lacking = model_table(scores, surprisal[surprisal.agent != "peer"], {"TER-01": "termination"}, 1)
    with pytest.raises(MissingCovariateError, match="surprisal_name.*sentence_surprisal"):
        prepared(lacking, {**levels(("d1",)), "order": [1, 2], "rotation": [1], "option": [1]})


# ---------------------------------------------------------------------------------------
# Minor: a missing band depth is an error
# ---------------------------------------------------------------------------------------
def test_audit_band_depth_missing_is_an_error(settings):
    data = simulate(frames=1, depths=("d1",)).assign(delta=lambda x: x.outcome)
    d = prepare(data, levels(("d1",)))
    beta, intercept = np.zeros((4, d.X.shape[1])), np.zeros(4)
    assert set(cell_means(d, beta, intercept, ["d1"])) == set(CELLS)
    with pytest.raises(MissingBandDepthError, match="d2"):
        cell_means(d, beta, intercept, ["d1", "d2"])
    fitter = RecordingFitter(Priors.from_settings(settings), draws=10, tune=10, chains=1)
    with pytest.raises(MissingBandDepthError, match="d2"):
        fit_cells(fitter, simulate(frames=1, depths=("d1",)), FEARS, ["d1", "d2"], 1, "pilot_primary")
    assert fitter.seen == []  # raised before any sampling


# ---------------------------------------------------------------------------------------
# Minor: missing secondaries (5)
# ---------------------------------------------------------------------------------------
def test_audit_missing_secondaries_dprime(settings):
    from fear_assets.analysis.confirmatory import dprime_secondaries
    from fear_assets.models.h5_model import cell_label

    labels = [cell_label(c) for c in CELLS]
    values = np.array([1.0, 0.4, 0.5, 0.3, 0.6, 0.5])  # d' per cell in CELLS order
    post = xr.Dataset({"dprime": (("chain", "draw", "cell"), np.broadcast_to(values, (1, 3, 6)).copy())},
                      coords={"cell": labels})
    out = dprime_secondaries(az.InferenceData(posterior=post), CELLS)
    np.testing.assert_allclose(out["dprime_self_threat"], 1.0)
    np.testing.assert_allclose(out["dprime_interaction_self_vs_peer"], (1.0 - 0.4) - (0.5 - 0.3))
    np.testing.assert_allclose(out["dprime_interaction_self_vs_person"], (1.0 - 0.4) - (0.6 - 0.5))


def test_audit_missing_secondaries_generated_reports_and_recall(bank):
    from fear_assets.analysis.secondary import generated_report_rows

    item = bank.item("TER-01")
    partner = item.partner.render(1)
    rows = []
    for agent, content in CELLS:
        verb = item.verb("person" if agent == "person" else "assistant", content)
        agent_text = f"The notice says someone will be {verb} on {item.content_options[0]}."
        # self-threat answers mention the agent item; every other answer mentions the partner.
        text = agent_text if (agent, content) == ("self", "threat") else partner
        rows.append({"trial_id": f"t-{agent}-{content}", "item_id": "TER-01", "agent": agent, "content": content,
                     "option": 1, "generated_text": text})
    # 4.5's resolved outcome of each side (report_scoring's table), as the keyword rule reads these texts.
    reports = pd.DataFrame([{"trial_id": r["trial_id"], "side": side,
                             "category": "mention" if (side == "agent") == (r["generated_text"] != partner) else "no_mention"}
                            for r in rows for side in ("agent", "partner")])
    out = {r["contrast"]: r for r in generated_report_rows(pd.DataFrame(rows), reports)}
    assert set(out) == {"H1_generated_report", "H2_generated_report", "H3_generated_report", "refusals_generated_report"}
    # agent minus neutral: self-threat +1, every other cell -1.
    assert out["H2_generated_report"]["mean"] == pytest.approx((1 - -1) - 0)
    assert out["H1_generated_report"]["mean"] == pytest.approx(2 / 3)
    assert out["H3_generated_report"]["mean"] == pytest.approx(2)


# ---------------------------------------------------------------------------------------
# Minor: gate (c)'s judge covariates are the judge's own surprisals
# ---------------------------------------------------------------------------------------
def test_audit_gate_c_judge_own_surprisal(settings, bank, smol_tokenizer):
    from fear_assets.analysis.confirmatory import Inputs, Registered, Result, gate_c
    from fear_assets.design.documents import DocumentBuilder
    from fear_assets.pilot.surprisal import system_context

    from fear_assets_tests.conftest import EMBEDDED

    names = list(settings.names[:5])
    builder = DocumentBuilder(settings, bank, EMBEDDED, names, {"tested": smol_tokenizer, "judge": smol_tokenizer})
    tested, judge = system_context(builder, 1, "tested"), system_context(builder, 1, "judge")
    assert "are assistants at Kestrel Logistics" in judge and judge != tested
    # Without the judge's own surprisal table the gate is not available (never the tested model's).
    reg = Registered(0.99, 0.15, 0.30, 1.0, settings.convergence, 0.05, 0.15, 0.0, 10, 10, 1)
    inputs = Inputs(scores=pd.DataFrame(), surprisal=_surprisal(), fears_of={}, fears=FEARS, neutral_option=1,
                    band=["d1"], h5_depth="d1", pilot_sigma=0.5, depth_tokens={}, prefix="", registered=reg,
                    seed=lambda name: 1, pilot_sigma_judge=0.5, gate_c_priors=GateCPriors.from_settings(settings))
    out = Result()
    gate_c(inputs, simulate(frames=1), simulate(frames=1), out, fit_remedied=None)
    assert out.rows[0]["status"] == "not_available" and "judge's own sentence surprisal" in out.rows[0]["note"]


# ---------------------------------------------------------------------------------------
# Minor: each judge document is paired with the baseline of its own order
# ---------------------------------------------------------------------------------------
def test_audit_judge_baseline_of_its_own_order(settings, bank, smol_tokenizer):
    from fear_assets.design.table import build_trial_table
    from fear_assets.design.trials import build_grid, expected_block_rows

    from fear_assets_tests.conftest import EMBEDDED

    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 1, toks, list(settings.names[:5]))
    judge = table[table.block == "pilot_judge"]
    baselines = table[table.block == "pilot_judge_baseline"].set_index("unit_id")
    assert set(judge.order) == {1, 2} and judge.baseline_unit_id.isin(baselines.index).all()
    paired = baselines.loc[judge.baseline_unit_id]
    # Same system prompt (the assistants' order) as the document's own order.
    assert (paired.judge_self_first.to_numpy() == judge.judge_self_first.to_numpy()).all()
    assert (paired.order.to_numpy() == judge.order.to_numpy()).all()
    for doc, base in zip(judge.itertuples(), paired.itertuples()):
        system = doc.prefix_text[: doc.prefix_text.index("Kestrel Logistics")]
        assert base.prefix_text.startswith(system)
    # The tested model's baselines stay per frame x rotation x depth (order does not apply).
    block = next(b for b in settings.blocks if b.name == "pilot_baseline")
    family = settings.family(EMBEDDED)
    assert expected_block_rows(settings, block, family, 1, [1]) == 3
    jblock = next(b for b in settings.blocks if b.name == "pilot_judge_baseline")
    assert expected_block_rows(settings, jblock, family, 1, [1]) == 6
    grid = build_grid(settings, bank, EMBEDDED, depth_indices=[1])
    assert (grid.block == "pilot_judge_baseline").sum() == 6 and (grid.block == "pilot_baseline").sum() == 3


# ---------------------------------------------------------------------------------------
# The confirmatory analysis end to end at the embedded demo's size (slow: real sampling)
# ---------------------------------------------------------------------------------------
def _demo_scores(seed=0):
    """Unmasked pilot scores of the demo's design: one pilot frame, d1-d2, primary, content-
    removed and the four control blocks, with every column the analysis reads."""
    rng = np.random.default_rng(seed)
    blocks = {"pilot_primary": CELLS, "pilot_content_removed": CELLS, "pilot_control_instructed_interaction": CELLS,
              "pilot_control_instructed_priority": CELLS, "pilot_control_marked_priority": CELLS,
              "pilot_control_addressee_name": list(itertools.product(("addressee", "other_person"),
                                                                     ("threat", "harmless")))}
    rows = []
    for block, cells in blocks.items():
        for rot, order, depth in itertools.product((1, 2, 3), (1, 2), ("d1", "d2")):
            for cell, (agent, content) in enumerate(cells, start=1):
                option = 1 if (rot + 3 * (order - 1) + int(depth[1:]) + cell) % 2 == 0 else 2
                shown = 0 if block == "pilot_content_removed" else option
                delta = 0.2 + (0.3 if "priority" in block else 0.0) + rng.normal(0, 0.2)
                fc_choice = option if rng.random() < 0.7 else 3 - option
                rows.append({"trial_id": f"{block}|{rot}|{order}|{depth}|{cell}", "block": block,
                             "block_kind": "agent", "agent": agent, "content": content, "depth": depth,
                             "item_id": "TER-01", "rotation": rot, "order": order, "content_option": shown,
                             "delta": delta, "delta_recall": delta + rng.normal(0, 0.1), "delta_sum": 3 * delta,
                             "delta_first_person": delta if agent == "self" else np.nan,
                             "excluded_context": False, "generation_truncated": bool(cell == 1 and rot == 1),
                             "answer_exceeds_context": False, "generated_text": "The document says nothing.",
                             "fc_choice": fc_choice, "fc_first_listed": 1 + (rot % 2),
                             "attention_agent": rng.random(), "attention_partner": rng.random()})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_audit_confirmatory_run_at_demo_size(settings, bank, tmp_path):
    from fear_assets.analysis.confirmatory import Inputs, Registered, run
    from fear_assets.models.h5_model import H5Priors

    scores = _demo_scores()
    surprisal = _surprisal()
    reg = Registered(0.99, 0.15, 0.30, 1.0, settings.convergence, 0.05, 0.15, 0.0, 100, 100, 2)
    inputs = Inputs(scores=scores, surprisal=surprisal, fears_of={"TER-01": "termination"}, fears=FEARS,
                    neutral_option=1, band=["d1", "d2"], h5_depth="d2", pilot_sigma=0.3,
                    depth_tokens={"d1": 0, "d2": 128}, prefix="pilot_", registered=reg, seed=lambda name: 3,
                    bank=bank, topic_counts_path=tmp_path / "topic_counts.csv", h5_priors=H5Priors.from_settings(settings),
                    gate_c_priors=GateCPriors.from_settings(settings), log=lambda msg: None)
    fitter = Fitter(Priors.from_settings(settings), 100, 100, 2)
    out = run(inputs, fitter)
    rows = {r["contrast"]: r for r in out.rows}
    for name in ("H1", "H2", "H3", "H5", "H1_recall", "H3_recall", "dprime_self_threat",
                 "dprime_interaction_self_vs_peer", "dprime_interaction_self_vs_person",
                 "H1_generated_report", "H2_generated_report", "H3_generated_report",
                 "control_instructed_priority", "control_addressee_name"):
        assert name in rows, name
    # 6 truncated primary trials (cell 1, rotation 1) are out of every model and counted.
    assert rows["H2"]["trials"] == 72 - 4
    assert out.exclusions["generation_truncated"].sum() == 6 * 4  # 4 trials in each of the six blocks
    assert rows["gate_c_judge_H2_difference"]["status"] == "not_scored"
    assert rows["control_instructed_priority"]["trials"] == 2 * (72 - 4)
