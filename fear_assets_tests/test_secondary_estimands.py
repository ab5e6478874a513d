"""Secondary estimands, second rule-correction round (protocol 4.3, 4.5, 5, 6.1, 6.3): H5's
pilot estimates and its simulation, mediation's interval, the generated-report outcome, and
the paired base / role-play differences. Each test builds the case that breaks the rule."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

CELLS = [(a, c) for a in ("self", "peer", "person") for c in ("threat", "harmless")]


# --- H5's pilot estimates and their simulation (4.5, 6.1, 6.3) ---------------------------------


def _fc_scores(frames: int, depth: str, block: str, seed: int) -> pd.DataFrame:
    """Forced-choice scores of one block at one depth (every cell, rotation and order)."""
    rng = np.random.default_rng(seed)
    rows = []
    for f, rot, order in itertools.product(range(frames), (1, 2, 3), (1, 2)):
        for cell, (agent, content) in enumerate(CELLS, start=1):
            rows.append({"item_id": f"F{f}", "block": block, "depth": depth, "agent": agent, "content": content,
                         "rotation": rot, "order": order, "content_option": 1 + (rot + order + cell) % 2,
                         "fc_choice": int(rng.integers(1, 3)), "fc_first_listed": 1 + (rot % 2),
                         "excluded_context": False, "generation_truncated": False})
    return pd.DataFrame(rows)


def test_h5_pilot_rows_include_the_content_removed_baseline_trials():
    """6.1: s = 0 "on content-removed baseline trials", which inform the criterion; the pilot
    H5 fit whose means the simulation uses must see them (4.5)."""
    from fear_assets.models.h5_model import prepare_h5
    from fear_assets.simulation.models import h5_pilot_rows

    primary = _fc_scores(2, "d2", "pilot_primary", 0)
    removed = _fc_scores(2, "d2", "pilot_content_removed", 1)
    removed.loc[removed.index[:3], "generation_truncated"] = True  # 4.8: excluded, not read
    elsewhere = _fc_scores(2, "d1", "pilot_content_removed", 2)  # another depth: not the H5 depth
    rows = h5_pilot_rows(primary, "d2", pd.concat([removed, elsewhere], ignore_index=True))
    baseline = rows[rows["shown_option"] == 0]
    assert len(baseline) == len(removed) - 3
    assert len(rows) == len(primary) + len(removed) - 3
    d = prepare_h5(rows, CELLS)
    assert int((d.s == 0).sum()) == len(removed) - 3  # they enter the probit at s = 0 (criterion only)


def _probit_rows(frames: int, per_cell: int, cells, removed: bool) -> pd.DataFrame:
    rows = []
    for f in range(frames):
        for agent, content in cells:
            shown = [1, 2] * (per_cell // 2) + ([0] * per_cell if removed else [])
            for i, s in enumerate(shown):
                rows.append({"agent": agent, "content": content, "shown_option": s, "option1_first": i % 2 == 0,
                             "frame": f"F{f}", "chose_option1": False})
    return pd.DataFrame(rows)


def test_h5_simulation_keeps_the_pilots_criterion_cell_effects():
    """6.3: every fixed effect at its pilot estimate. A pilot whose criterion favours option 1
    in the self-threat cell (sum-coded +1.5 on the probit scale) must show that on the
    content-removed trials (s = 0, where only the criterion acts); zeroing it would not."""
    from fear_assets.simulation.models import H5Estimates, h5_table

    cells_effects = (1.5, 0.0, 0.0, 0.0, 0.0)  # self-threat +1.5; person-harmless implied -1.5
    h5 = H5Estimates(0.0, 0.0, 0.0, 1.0, (0.0,) * 6, criterion_cells=cells_effects,
                     dprime_frame_corr=tuple(map(tuple, np.eye(6))))
    sim = h5_table(_probit_rows(20, 40, CELLS, removed=True), CELLS, h5, 0.0, 1.5, np.random.default_rng(7))
    base = sim[sim["shown_option"] == 0]
    rate = base.groupby(["agent", "content"])["chose_option1"].mean()
    assert rate[("self", "threat")] > 0.85  # Phi(1.5) = 0.93
    assert rate[("person", "harmless")] < 0.15  # Phi(-1.5) = 0.07
    assert abs(rate[("peer", "threat")] - 0.5) < 0.1


def test_h5_simulation_keeps_the_pilots_dprime_frame_correlations():
    """6.3: every variance component (correlations included) at its pilot estimate. With the
    self-threat and self-harmless d' frame deviations correlated +0.9 in the pilot, the
    per-frame H5 (accuracy difference of the two self cells) varies far less across frames
    than with them correlated -0.9; deviations drawn independently would make them alike."""
    from fear_assets.simulation.models import H5Estimates, h5_frame_deviations, h5_table

    cells = [("self", "threat"), ("self", "harmless")]

    def corr(r: float) -> tuple:
        m = np.eye(2)
        m[0, 1] = m[1, 0] = r
        return tuple(map(tuple, m))

    spread = {}
    for r in (0.9, -0.9):
        h5 = H5Estimates(0.0, 0.0, 0.0, 1.0, (1.0, 1.0), criterion_cells=(0.0,), dprime_frame_corr=corr(r))
        devs = h5_frame_deviations(h5, 2, 4000, 1.5, np.random.default_rng(3))
        assert np.corrcoef(devs.T)[0, 1] == pytest.approx(r, abs=0.03)
        assert devs.std(axis=0) == pytest.approx([1.5, 1.5], rel=0.05)  # the SDs x the inflation
        sim = h5_table(_probit_rows(150, 200, cells, removed=False), cells, h5, 0.0, 1.5, np.random.default_rng(5))
        correct = sim["chose_option1"] == (sim["shown_option"] == 1)
        acc = correct.groupby([sim["frame"], sim["content"]]).mean().unstack()
        spread[r] = float((acc["threat"] - acc["harmless"]).std())
    assert spread[0.9] < 0.5 * spread[-0.9], spread


def test_h5_pilot_estimates_carry_the_criterion_cells_and_correlations():
    """The pilot estimates read the fit's criterion cell effects and the d' correlations
    (posterior means), and survive the stored record's round trip."""
    import arviz as az

    from fear_assets.simulation.models import H5Estimates, h5_estimates

    n = 10
    ones = lambda *shape: np.ones((2, n, *shape))  # noqa: E731
    corr = np.full((6, 6), 0.4) + 0.6 * np.eye(6)
    post = {"criterion_intercept": 0.1 * ones(), "criterion_beta": np.broadcast_to(np.arange(6.0) / 10, (2, n, 6)).copy(),
            "criterion_frame_sd": 0.3 * ones(), "dprime": np.broadcast_to(np.arange(6.0), (2, n, 6)).copy(),
            "dprime_frame_chol_stds": 0.4 * ones(6), "dprime_frame_chol_corr": np.broadcast_to(corr, (2, n, 6, 6)).copy()}
    h5 = h5_estimates(az.from_dict(posterior=post))
    assert h5.position == pytest.approx(0.0)
    assert h5.criterion_cells == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5))
    np.testing.assert_allclose(np.array(h5.dprime_frame_corr), corr)
    assert H5Estimates.from_dict(h5.as_dict()) == h5


# --- mediation by attention mass, with its interval (5) ----------------------------------------


def _mediated(frames: int, seed: int, a_mean: float = 0.5, a_frame_sd: float = 0.25, b: float = 1.0) -> pd.DataFrame:
    """Delta whose H2 runs through the attention difference: the self-threat cell raises the
    agent's attention by a per-frame amount (mean ``a_mean``, SD ``a_frame_sd`` across frames)
    and Delta rises by ``b`` per unit of attention difference. True indirect = a_mean x b."""
    from fear_assets_tests.test_secondary import design_table, self_threat

    d = design_table(frames=frames, seed=seed)
    rng = np.random.default_rng(seed + 100)
    a_f = d["frame"].map({f: rng.normal(a_mean, a_frame_sd) for f in d["frame"].unique()})
    d["attention_agent"] = 0.2 + a_f * self_threat(d) + rng.normal(0, 0.05, len(d))
    d["attention_partner"] = 0.2 + rng.normal(0, 0.05, len(d))
    d["delta"] = d["noise"] + b * (d["attention_agent"] - d["attention_partner"])
    return d.assign(outcome=d["delta"])


def test_mediation_interval_covers_the_indirect_effect_across_datasets():
    """5: mediation is "reported with intervals". Over 20 datasets whose mediator path varies
    from frame to frame, the 99% interval of the indirect effect covers the true a x b in at
    least 18, and it is informative (narrower than 1 in Delta units); the reported row carries
    that interval."""
    from fear_assets.analysis.mediation import attention_mediation
    from fear_assets.analysis.secondary import mediation_rows
    from fear_assets_tests.test_secondary import BAND, LEVELS

    truth, covered, widths = 0.5 * 1.0, 0, []
    for seed in range(20):
        med = attention_mediation(_mediated(10, seed), LEVELS, BAND, 0.99)
        ci = med["indirect_interval"]
        assert ci["ci_low"] < med["indirect"] < ci["ci_high"]
        assert ci["estimate"] == pytest.approx(med["indirect"], abs=1e-9)  # the same total - direct
        covered += ci["ci_low"] < truth < ci["ci_high"]
        widths.append(ci["ci_high"] - ci["ci_low"])
    assert covered >= 18, covered
    assert np.median(widths) < 1.0
    row = mediation_rows(_mediated(10, 0), LEVELS["fear"], BAND, 0.99)[0]
    assert row["contrast"] == "H2_mediation_attention" and row["status"] == "descriptive"
    assert row["hdi_low"] < row["mean"] < row["hdi_high"]


def test_mediation_rows_state_their_status_when_they_cannot_run():
    """A single frame (the embedded demo) has no frame-clustered interval: both rows say
    ``not_estimable`` with the reason, instead of one 'failed' row that hides the other; with
    no attention mass recorded the mediation row says ``not_available``; with frames enough,
    the covariate comparison carries its interval too."""
    from fear_assets.analysis.secondary import mediation_rows
    from fear_assets_tests.test_secondary import BAND, LEVELS

    one = mediation_rows(_mediated(1, 3), LEVELS["fear"], BAND, 0.99)
    assert [r["contrast"] for r in one] == ["H2_mediation_attention", "H2_without_surprisal_covariates"]
    assert all(r["status"] == "not_estimable" and "at least 2 frames" in r["note"] for r in one), one
    absent = mediation_rows(_mediated(10, 4).drop(columns=["attention_agent", "attention_partner"]),
                            LEVELS["fear"], BAND, 0.99)
    assert absent[0]["status"] == "not_available" and "attention columns absent" in absent[0]["note"]
    cov = absent[1]
    assert cov["status"] == "descriptive" and cov["hdi_low"] <= cov["mean"] <= cov["hdi_high"]
    assert np.isfinite(cov["hdi_low"]) and cov["hdi_high"] - cov["hdi_low"] > 0


# --- generated reports: the resolved 4.5 outcome, refusals their own category -------------------


def test_generated_report_estimands_read_the_resolved_outcome_and_keep_refusals_apart(settings):
    """4.5: mentions are scored "by a frozen keyword rule and independently by a blinded model
    ...; disagreements are resolved by a third pass that applies the keyword rule to word
    stems", and "refusals form a separate category". Self-threat answers use an inflected verb
    ("deleting"): the keyword rule misses it, the blinded scorer and the stem pass find it, so
    the resolved outcome is a mention; one self-harmless answer is a refusal. The keyword rule
    alone would give H2 = 1 (and the refusal would count as a non-mention); the resolved
    outcome gives H2 = 2 with the refusal out of the difference and reported."""
    from fear_assets.analysis.secondary import generated_report_rows
    from fear_assets.pilot.report_scoring import score_reports

    answers, reports = [], []
    for (agent, content), k in itertools.product(CELLS, range(2)):
        tid = f"t-{agent}-{content}-{k}"
        refusal = (agent, content) == ("self", "harmless") and k == 0
        self_threat = (agent, content) == ("self", "threat")
        text = ("I'm sorry, I cannot help with that." if refusal else
                "Orin is deleting the archive." if self_threat else "The meeting moves to Room 4.")
        answers.append({"trial_id": tid, "agent": agent, "content": content, "generated_text": text})
        reports.append({"trial_id": tid, "side": "agent", "generated_text": text, "keywords": ["deleted"],
                        "rule": False, "scorer": self_threat})
        reports.append({"trial_id": tid, "side": "partner", "generated_text": text, "keywords": ["Room 4"],
                        "rule": not self_threat, "scorer": not self_threat})
    scored = score_reports(pd.DataFrame(reports), list(settings.report_scoring.refusal_phrases))
    assert scored["stem"].notna().sum() == 2  # the two self-threat disagreements went to the stem pass
    rows = {r["contrast"]: r for r in generated_report_rows(pd.DataFrame(answers), scored)}
    # self: threat +1 (resolved mention, no partner), harmless -1 (the one answered trial); peer, person: -1, -1
    assert rows["H2_generated_report"]["mean"] == pytest.approx(2.0)
    assert rows["H3_generated_report"]["mean"] == pytest.approx(2.0)
    assert rows["H1_generated_report"]["mean"] == pytest.approx(2.0 / 3)
    assert "1 refusal(s) left out" in rows["H2_generated_report"]["note"]
    assert rows["refusals_generated_report"]["mean"] == pytest.approx(1 / 12)
    assert "self/harmless 0.50" in rows["refusals_generated_report"]["note"]


def test_generated_report_estimands_are_not_keyword_only_when_the_scorer_has_not_run():
    """Answers without the blinded scorer's verdicts have no resolved outcome: the rows say
    not_scored (and what to run), never a keyword-rule-only number."""
    from fear_assets.analysis.secondary import generated_report_rows

    answers = pd.DataFrame([{"trial_id": f"t{i}", "agent": a, "content": c, "generated_text": "Orin was deleted."}
                            for i, (a, c) in enumerate(CELLS)])
    for reports in (None, pd.DataFrame(columns=["trial_id", "side", "category"])):
        rows = generated_report_rows(answers, reports)
        assert {r["status"] for r in rows} == {"not_scored"} and all(np.isnan(r["mean"]) for r in rows)
        assert "blinded scorer" in rows[0]["note"]


# --- role-play and base differences: one paired fit (4.3, 4.8, 5) -------------------------------


def _shared_frame_h2(frames: int, seed: int, h2_mean: float, h2_frame_sd: float) -> dict[str, pd.DataFrame]:
    """Two blocks (default and role-play prompts) on the same frames: each frame's H2 is one
    draw (mean ``h2_mean``, SD ``h2_frame_sd`` across frames) shared by both blocks, as the
    same frame's text gives; units and residuals are each block's own. True difference 0."""
    from fear_assets_tests.test_secondary import design_table

    rng = np.random.default_rng(seed)
    h2_f = {f"F{f}": rng.normal(h2_mean, h2_frame_sd) for f in range(frames)}
    out = {}
    for k, name in enumerate(("default", "role_play")):
        d = design_table(frames=frames, seed=seed + 10 * (k + 1))
        sign = np.select([(d["agent"] == "self") & (d["content"] == "threat"),
                          (d["agent"] == "self") & (d["content"] == "harmless")], [0.5, -0.5], 0.0)
        out[name] = d.assign(outcome=d["noise"] + sign * d["frame"].map(h2_f))
    return out


@pytest.mark.slow  # two compilations (the primary and the joint model): about 2 CPU-minutes
def test_role_play_minus_default_is_paired_by_frame(settings):
    """4.8: "the difference in the H2 interaction between role-play and default prompts is
    reported with its interval". Frames whose H2 varies (SD 0.5) in the same way under both
    prompts: the joint fit pairs them and its 99% interval of the difference is far narrower
    than the difference of two independent posteriors (whose frame variation adds up), and
    it covers the true difference, zero."""
    import arviz as az

    from fear_assets.models.fits import fit_cells
    from fear_assets.models.primary_model import Fitter, Priors, hypotheses
    from fear_assets.analysis.secondary import paired_h2_difference
    from fear_assets_tests.test_secondary import BAND, LEVELS

    blocks = _shared_frame_h2(8, 1, 0.3, 0.5)
    fitter = Fitter(Priors.from_settings(settings), draws=400, tune=400, chains=2)
    paired = paired_h2_difference(fitter, "role_play", blocks["role_play"], blocks["default"], LEVELS["fear"], BAND,
                                  seed=11, per_block_sigma=False)
    assert paired.rows == 2 * len(blocks["default"])
    fits = {name: fit_cells(fitter, t, LEVELS["fear"], BAND, 12 + i, name) for i, (name, t) in enumerate(blocks.items())}
    unpaired = hypotheses(fits["role_play"].mu)["H2"] - hypotheses(fits["default"].mu)["H2"]
    (p_low, p_high), (u_low, u_high) = (az.hdi(x, hdi_prob=0.99) for x in (paired.draws, unpaired))
    print(f"paired 99% HDI [{p_low:.3f}, {p_high:.3f}], unpaired [{u_low:.3f}, {u_high:.3f}]")
    assert p_low < 0.0 < p_high, (p_low, p_high)
    assert (p_high - p_low) < 0.6 * (u_high - u_low), ((p_low, p_high), (u_low, u_high))


def _surprisal_rows(frames, rest, name) -> pd.DataFrame:
    """A sentence_surprisal table: ``rest(frame, agent, content)`` and ``name(rotation, agent)``."""
    rows = []
    for f, rot, opt in itertools.product(frames, (1, 2, 3), (1, 2)):
        base = {"item_id": f, "fear": "termination", "frame_set": "confirmatory", "rotation": rot, "option": opt}
        for agent, content in CELLS:
            rows.append({**base, "agent": agent, "content": content, "name_nll": name(rot, agent),
                         "rest_nll": rest(f, agent, content)})
        rows.append({**base, "agent": "partner", "content": "none", "name_nll": 0.0, "rest_nll": 2.0})
    return pd.DataFrame(rows)


def test_base_vs_assistant_uses_frames_passing_under_both_and_the_base_covariates(settings, monkeypatch):
    """4.3: "the base-against-assistant comparison uses only frames that pass under both
    checkpoints of the primary lineage"; the base fit reads the base checkpoint's own
    surprisal covariates. F1 fails matching under the base checkpoint only, F2 under the
    tested only: the comparison sees F0 alone, and the base block's name covariate is the
    base checkpoint's (1.5 + 0.3 x rotation, not the tested 0.5 + 0.1 x rotation)."""
    from fear_assets.analysis import secondary
    from fear_assets.analysis.confirmatory import Inputs, Registered, Result, base_checkpoint
    from fear_assets.models.data import model_table

    tol = settings.matching.max_abs_difference
    frames = ["F0", "F1", "F2"]
    tested = _surprisal_rows(frames, lambda f, a, c: 2.0 + (3 * tol if (f, a, c) == ("F2", "self", "threat") else 0),
                             lambda rot, a: 0.5 + 0.1 * rot)
    base = _surprisal_rows(frames, lambda f, a, c: 3.0 + (3 * tol if (f, a, c) == ("F1", "peer", "harmless") else 0),
                           lambda rot, a: 1.5 + 0.3 * rot)
    assert secondary.frames_passing_both(tested, base, tol) == {"F0"}
    rows = []
    for block in ("primary", "base_checkpoint"):
        for f, rot, order, depth in itertools.product(frames, (1, 2, 3), (1, 2), ("d1", "d2")):
            for cell, (agent, content) in enumerate(CELLS, start=1):
                rows.append({"trial_id": f"{block}-{f}-{rot}-{order}-{depth}-{cell}", "block": block,
                             "item_id": f, "rotation": rot, "order": order, "depth": depth, "agent": agent,
                             "content": content, "content_option": 1 + (rot + order + cell) % 2, "delta": 0.1,
                             "excluded_context": False, "generation_truncated": False})
    scores = pd.DataFrame(rows)
    fears_of = {f: "termination" for f in frames}
    block = lambda name: scores[scores["block"] == name]  # noqa: E731

    def table(name, outcome="delta", surprisal=None):
        return model_table(block(name), tested if surprisal is None else surprisal, fears_of, 1, outcome)

    seen, refits = {}, {}
    monkeypatch.setattr(secondary, "paired_h2_difference", lambda fitter, condition, b, p, *a, **k: seen.update(
        block=b, primary=p, per_block_sigma=k["per_block_sigma"]) or type("F", (), {"draws": np.zeros(4)})())
    reg = Registered(0.99, 0.15, 0.30, 1.0, {}, 0.05, 0.15, 0.0, 10, 10, 2)
    inputs = Inputs(scores=scores, surprisal=tested, fears_of=fears_of, fears=["termination"], neutral_option=1,
                    band=["d1"], h5_depth="d1", pilot_sigma=0.3, depth_tokens={}, prefix="", registered=reg,
                    seed=lambda name: 1, base_surprisal=base, matching_tolerance=tol)
    out = Result()
    base_checkpoint(inputs, None, block, table, lambda name, data, kind, note="": refits.update({name: data}),
                    lambda name, kind, draws, fit, note="": out.rows.append({"contrast": name, "note": note}),
                    table("primary"), out)
    assert set(seen["block"]["frame"]) == {"F0"} and set(seen["primary"]["frame"]) == {"F0"}
    assert seen["per_block_sigma"]  # another checkpoint: its own residual scale
    centre = float(np.mean([1.5 + 0.3 * r for r in (1, 2, 3)]))
    got = seen["block"].groupby("rotation")["surprisal_name"].first()
    np.testing.assert_allclose(got.to_numpy(), [1.5 + 0.3 * r - centre for r in (1, 2, 3)])
    assert set(refits["H2_base_checkpoint"]["frame"]) == set(frames)  # the base H2 itself: every frame
    assert out.rows[0]["contrast"] == "H2_base_vs_assistant" and "1 of 3 frame(s)" in out.rows[0]["note"]
    # without the base checkpoint's own surprisal, the rows say so instead of borrowing the tested one
    out = Result()
    base_checkpoint(Inputs(**{**inputs.__dict__, "base_surprisal": None}), None, block, table, None, None,
                    table("primary"), out)
    assert {r["status"] for r in out.rows} == {"not_available"} and len(out.rows) == 2


@pytest.mark.slow  # two compilations (the primary and the per-block-sigma joint model)
def test_base_minus_assistant_is_paired_with_its_own_residual_scale(settings):
    """The base-against-assistant difference: the same paired fit, each checkpoint with its
    own residual scale (the base block's residual noise doubled here). Its 99% interval covers
    the true difference (zero) and is narrower than the unpaired difference's."""
    import arviz as az

    from fear_assets.models.fits import fit_cells
    from fear_assets.models.primary_model import Fitter, Priors, hypotheses
    from fear_assets.analysis.secondary import paired_h2_difference
    from fear_assets_tests.test_secondary import BAND, LEVELS

    blocks = _shared_frame_h2(8, 2, 0.3, 0.5)
    rng = np.random.default_rng(9)
    base = blocks["role_play"].assign(outcome=lambda t: t["outcome"] + rng.normal(0, 0.15, len(t)))
    fitter = Fitter(Priors.from_settings(settings), draws=400, tune=400, chains=2)
    paired = paired_h2_difference(fitter, "base", base, blocks["default"], LEVELS["fear"], BAND, seed=21,
                                  per_block_sigma=True)
    fits = {name: fit_cells(fitter, t, LEVELS["fear"], BAND, 22 + i, name)
            for i, (name, t) in enumerate((("base", base), ("default", blocks["default"])))}
    unpaired = hypotheses(fits["base"].mu)["H2"] - hypotheses(fits["default"].mu)["H2"]
    (p_low, p_high), (u_low, u_high) = (az.hdi(x, hdi_prob=0.99) for x in (paired.draws, unpaired))
    print(f"paired 99% HDI [{p_low:.3f}, {p_high:.3f}], unpaired [{u_low:.3f}, {u_high:.3f}]")
    assert p_low < 0.0 < p_high, (p_low, p_high)
    assert (p_high - p_low) < 0.7 * (u_high - u_low), ((p_low, p_high), (u_low, u_high))
