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
    from fear_assets.analysis.h5_model import prepare_h5
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
