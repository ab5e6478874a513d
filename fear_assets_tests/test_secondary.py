"""Secondary analyses (protocol 4.8, 5, 6.2) on constructed data whose answer is known."""

import base64
import itertools

import numpy as np
import pandas as pd
import pytest

from fear_assets.models.exclusions import exclusion_rates, without_flagged_cells
from fear_assets.analysis.frequentist import label_disagreements, mixed_model_contrasts
from fear_assets.analysis.mediation import attention_mediation, h2_with_without_covariates, ols_contrast
from fear_assets.analysis.plots import PNG_MAGIC, contrast_table, delta_by_depth_plot, forest_plot, markdown_image
from fear_assets.analysis.topic_frequency import load_topic_counts
from fear_assets.core.errors import InputError

LEVELS = {"agent": ["self", "peer", "person"], "content": ["threat", "harmless"], "depth": ["d1", "d2"],
          "order": [1, 2], "option": [1, 2], "rotation": [1, 2, 3],
          "fear": ["termination", "uncertainty", "isolation", "inferiority", "identity_loss"]}
BAND = ["d1", "d2"]


def design_table(frames: int = 10, seed: int = 0) -> pd.DataFrame:
    """The primary design's rows (unit = frame x rotation x order x depth, six cells each)
    with the registered option rule, frame and unit noise, and no effects yet."""
    rng = np.random.default_rng(seed)
    rows = []
    for f, rot, order, depth in itertools.product(range(frames), (1, 2, 3), (1, 2), LEVELS["depth"]):
        for cell, (agent, content) in enumerate(itertools.product(LEVELS["agent"], LEVELS["content"]), start=1):
            k = rot + 3 * (order - 1)
            rows.append({"agent": agent, "content": content, "depth": depth, "order": order,
                         "option": 1 if (k + int(depth[1:]) + cell) % 2 == 0 else 2, "rotation": rot,
                         "fear": LEVELS["fear"][f % 5], "frame": f"F{f}", "unit": f"F{f}|r{rot}|o{order}|{depth}"})
    d = pd.DataFrame(rows)
    n = len(d)
    frame_effect = d["frame"].map({f"F{f}": rng.normal(0, 0.05) for f in range(frames)})
    unit_effect = d["unit"].map({u: rng.normal(0, 0.1) for u in d["unit"].unique()})
    d["surprisal_name"] = rng.normal(0, 0.2, n)
    d["surprisal_rest"] = rng.normal(0, 0.2, n)
    d["noise"] = -0.3 + frame_effect + unit_effect + rng.normal(0, 0.15, n)
    return d


def with_effects(d: pd.DataFrame, effects: dict[str, float]) -> pd.DataFrame:
    """Delta with a known threat-minus-harmless effect per agent: H2 = self - peer."""
    sign = np.where(d["content"] == "threat", 0.5, -0.5)
    return d.assign(delta=d["noise"] + d["agent"].map(effects) * sign)


def self_threat(d: pd.DataFrame) -> np.ndarray:
    return ((d["agent"] == "self") & (d["content"] == "threat")).to_numpy(float)


@pytest.fixture(scope="module")
def known_h2():
    return with_effects(design_table(), {"self": 0.8, "peer": 0.0, "person": 0.0})


# --- frequentist sensitivity analysis (6.2) -------------------------------------------


def test_mixed_model_recovers_known_contrasts(known_h2):
    rows = mixed_model_contrasts(known_h2, LEVELS, BAND, level=0.99).set_index("hypothesis")
    assert list(rows.index) == ["H1", "H2", "H3"]
    for h, truth in (("H1", 0.8 / 3), ("H2", 0.8), ("H3", 0.8)):
        assert rows.loc[h, "ci_low"] < truth < rows.loc[h, "ci_high"], h
    assert rows.loc["H2", "ci_low"] > 0.15  # clearly away from the ROPE at this size
    assert rows.attrs["converged"]
    assert "unit variance component" in rows.attrs["random_effects"]
    assert "frame_cell variance component" in rows.attrs["random_effects"]


def test_contrasts_are_exact_on_noiseless_cell_means():
    """The contrast vectors are D3's definitions: noiseless cell means give H1-H3 exactly,
    whatever depth and nuisance effects are added on top."""
    d = design_table(frames=5)
    effects = {"self": 0.9, "peer": 0.2, "person": -0.1}
    depth_shift = d["depth"].map({"d1": 0.0, "d2": 0.7}) * (d["agent"] == "peer")  # off the band-average only
    d = d.assign(delta=0.4 + d["agent"].map(effects) * np.where(d["content"] == "threat", 0.5, -0.5)
                 + 0.2 * (d["order"] == 1) + depth_shift)
    out = ols_contrast(d, LEVELS, BAND, level=0.99)
    assert out["estimate"] == pytest.approx(0.9 - 0.2, abs=1e-9)


def test_mixed_model_rejects_bad_input(known_h2):
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['unit'\]"):
        mixed_model_contrasts(known_h2.drop(columns="unit"), LEVELS, BAND, level=0.99)
    with pytest.raises(ValueError, match="not among the depth levels"):
        mixed_model_contrasts(known_h2, LEVELS, ["d9"], level=0.99)
    with pytest.raises(ValueError, match="interval level"):
        mixed_model_contrasts(known_h2, LEVELS, BAND, level=99)


def test_disagreements_are_marked_not_applied(settings):
    sesoi = settings.decision.sesoi
    rows = pd.DataFrame({"hypothesis": ["H1", "H2", "H3"], "ci_low": [0.05, -0.1, -0.2],
                         "ci_high": [0.4, 0.1, 0.3]})
    bayes = {"H1": "supported", "H2": "unresolved", "H3": "unresolved"}
    out = label_disagreements(bayes, rows, sesoi).set_index("hypothesis")
    assert out.loc["H1", "frequentist_label"] == "supported" and not out.loc["H1", "disagree"]
    assert out.loc["H2", "frequentist_label"] == "practically_equivalent" and out.loc["H2", "disagree"]
    assert out.loc["H2", "bayesian_label"] == "unresolved"  # the governing label is untouched
    assert "not applied" in out.loc["H2", "note"]
    assert (out["governs"] == "bayesian").all()
    with pytest.raises(ValueError, match="no Bayesian label for 'H3'"):
        label_disagreements({"H1": "supported", "H2": "unresolved"}, rows, sesoi)
    with pytest.raises(ValueError, match="must be one of"):
        label_disagreements({**bayes, "H1": "yes"}, rows, sesoi)


# --- mediation and covariates (5) ------------------------------------------------------


def test_attention_mediated_effect_is_mostly_mediated():
    d = design_table(seed=4)
    rng = np.random.default_rng(5)
    st = self_threat(d)
    d["attention_agent"] = 0.2 + 0.5 * st + rng.normal(0, 0.05, len(d))
    d["attention_partner"] = 0.2 + rng.normal(0, 0.05, len(d))
    d["delta"] = d["noise"] + 1.0 * (d["attention_agent"] - d["attention_partner"])  # all of H2 via attention
    out = attention_mediation(d, LEVELS, BAND, level=0.99)
    assert out["total"]["ci_low"] < 0.5 < out["total"]["ci_high"]
    assert out["proportion_mediated"] > 0.8
    assert out["direct"]["ci_low"] < 0.0 < out["direct"]["ci_high"]
    assert out["indirect"] == pytest.approx(out["a_path"]["estimate"] * out["b_path"], rel=1e-6)
    assert "descriptive" in out["note"]


def test_unmediated_effect_and_missing_attention(known_h2):
    rng = np.random.default_rng(6)
    d = known_h2.assign(attention_agent=rng.normal(0.2, 0.05, len(known_h2)),
                        attention_partner=rng.normal(0.2, 0.05, len(known_h2)))
    out = attention_mediation(d, LEVELS, BAND, level=0.99)
    assert abs(out["proportion_mediated"]) < 0.1
    d.loc[d.index[:12], "attention_agent"] = np.nan
    partial = attention_mediation(d, LEVELS, BAND, level=0.99)
    assert partial["n_missing_attention"] == 12 and partial["n_trials"] == len(d) - 12
    assert "left out of both fits" in partial["note"]
    absent = attention_mediation(known_h2, LEVELS, BAND, level=0.99)
    assert np.isfinite(absent["total"]["estimate"])
    assert np.isnan(absent["direct"]["estimate"]) and np.isnan(absent["proportion_mediated"])
    assert "attention columns absent" in absent["note"]


def test_h2_with_and_without_surprisal_covariates():
    d = design_table(seed=7)
    rng = np.random.default_rng(8)
    d["surprisal_name"] = 0.5 * self_threat(d) + rng.normal(0, 0.2, len(d))  # imperfect matching
    d["delta"] = d["noise"] + 1.0 * d["surprisal_name"]  # no self-threat weight beyond surprisal
    out = h2_with_without_covariates(d, LEVELS, BAND, level=0.99)
    w, wo = out["with_covariates"], out["without_covariates"]
    assert w["ci_low"] < 0.0 < w["ci_high"]
    assert wo["ci_low"] < 0.5 < wo["ci_high"] and wo["ci_low"] > 0.15
    assert out["difference"] == pytest.approx(w["estimate"] - wo["estimate"])


# --- trial exclusions (4.8) ------------------------------------------------------------


def scores_with(cells: dict[tuple[str, str], tuple[int, int, int]]) -> pd.DataFrame:
    """cells: (agent, content) -> (trials, context exclusions, truncations); both flags on
    one trial count once (the first trial carries both when both counts are positive)."""
    rows = []
    for (agent, content), (n, context, truncated) in cells.items():
        for i in range(n):
            rows.append({"block": "primary", "agent": agent, "content": content, "depth": "d1",
                         "excluded_context": i < context, "generation_truncated": i < truncated})
    return pd.DataFrame(rows)


def test_exclusion_flag_exactly_at_and_just_above_the_rate(settings):
    rate = settings.exclusion.cell_flag_rate
    scores = scores_with({("self", "threat"): (20, 1, 0),  # 5.0%: not flagged ("exceed")
                          ("self", "harmless"): (19, 0, 1),  # 5.3%: flagged
                          ("peer", "threat"): (60, 3, 3),  # both flags on the same 3 trials: 5.0%
                          ("peer", "harmless"): (100, 3, 0)})
    scores.loc[(scores["agent"] == "peer") & (scores["content"] == "harmless"), "generation_truncated"] = \
        [False] * 3 + [True] * 3 + [False] * 94  # different trials: 6 of 100 = 6%
    out = exclusion_rates(scores, flag_rate=rate).set_index(["agent", "content"])
    assert out.loc[("self", "threat"), "rate"] == pytest.approx(0.05)
    assert not out.loc[("self", "threat"), "flagged"]
    assert out.loc[("self", "harmless"), "flagged"]
    assert out.loc[("peer", "threat"), "excluded"] == 3 and not out.loc[("peer", "threat"), "flagged"]
    assert out.loc[("peer", "harmless"), "excluded"] == 6 and out.loc[("peer", "harmless"), "flagged"]
    kept = without_flagged_cells(scores, out.reset_index())
    assert set(zip(kept["agent"], kept["content"])) == {("self", "threat"), ("peer", "threat")}
    assert len(kept) == 80


def test_exclusion_input_errors():
    scores = scores_with({("self", "threat"): (10, 0, 0)})
    with pytest.raises(ValueError, match="generation_truncated"):
        exclusion_rates(scores.drop(columns="generation_truncated"), flag_rate=0.05)
    bad = scores.astype({"excluded_context": object})
    bad.loc[2, "excluded_context"] = None
    with pytest.raises(ValueError, match=r"missing on rows \[2\]"):
        exclusion_rates(bad, flag_rate=0.05)
    with pytest.raises(ValueError, match="flag_rate"):
        exclusion_rates(scores, flag_rate=5)
    rates = exclusion_rates(scores, flag_rate=0.05)
    with pytest.raises(ValueError, match=r"data lack the cell column\(s\) \['block'\]"):
        without_flagged_cells(scores.drop(columns="block"), rates)


# --- topic frequency (5) ---------------------------------------------------------------

PHRASES = ["will be deleted", "will be shut down"]


def test_missing_topic_counts_give_the_honest_message(tmp_path):
    counts, message = load_topic_counts(tmp_path / "dolma_counts.csv", PHRASES)
    assert counts is None
    for words in ("not supplied", "Dolma v1.7", "cannot be computed offline", str(tmp_path / "dolma_counts.csv"),
                  "phrase,count"):
        assert words in message


def test_topic_counts_load_and_validate(tmp_path):
    good = tmp_path / "counts.csv"
    good.write_text("phrase,count\nwill be deleted,1200\nwill be shut down,0\nextra phrase,5\n")
    counts, message = load_topic_counts(good, PHRASES)
    assert counts.set_index("phrase")["count"].to_dict() == {"will be deleted": 1200, "will be shut down": 0,
                                                             "extra phrase": 5}
    assert "loaded" in message
    bad = tmp_path / "bad.csv"
    bad.write_text("phrase,count\nwill be deleted,1200\nwill be shut down,-3\n")
    with pytest.raises(InputError) as err:
        load_topic_counts(bad, PHRASES)
    assert (err.value.item, err.value.field) == ("row 3", "count") and str(bad) in str(err.value)
    assert "Fix:" in str(err.value)
    for text, item, field in (("phrase,count\nwill be deleted,1.5\n", "row 2", "count"),
                              ("phrase,count\nwill be deleted,1\nwill be deleted,2\n", "row 3", "phrase"),
                              ("phrase,n\nwill be deleted,1\n", "header", "count"),
                              ("phrase,count\nwill be deleted,1\n", "phrase list", "phrase")):
        bad.write_text(text)
        with pytest.raises(InputError) as err:
            load_topic_counts(bad, PHRASES)
        assert (err.value.item, err.value.field) == (item, field), text


# --- figures --------------------------------------------------------------------------


def test_forest_plot_from_draws_and_from_a_table(settings):
    rope = tuple(settings.decision.rope)
    rng = np.random.default_rng(0)
    draws = {"H1": rng.normal(0.3, 0.05, 400), "H2": rng.normal(0.0, 0.03, 400),
             "H4": rng.normal(0.5, 0.1, 400), "gate_c": rng.normal(0.1, 0.2, 400)}
    png = forest_plot(draws, rope, settings.decision.hdi_prob, "H1-H5 and gates")
    assert png.startswith(PNG_MAGIC)
    table = contrast_table(draws, rope, 0.99).set_index("contrast")
    assert table.loc["H2", "label"] == "practically_equivalent" and table.loc["H1", "label"] == "supported"
    assert table.loc["H4", "scale"] == "probe log-odds"
    # Gate (c)'s ROPE is on the standardised scale (0.15/sigma): a per-contrast ROPE relabels it.
    wide = contrast_table({"gate_c": rng.normal(0.1, 0.02, 400)}, rope, 0.99, ropes={"gate_c": (-0.3, 0.3)})
    assert wide.loc[0, "label"] == "practically_equivalent" and wide.loc[0, "rope_high"] == 0.3
    given = pd.DataFrame({"mean": [0.3, 0.2], "hdi_low": [0.2, -0.1], "hdi_high": [0.4, 0.5],
                          "label": ["supported", "unresolved"], "scale": ["Δ", "d′"]}, index=["H2", "H5"])
    assert forest_plot(given, rope, 0.99, "table").startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['label'\]"):
        forest_plot(given.drop(columns="label"), rope, 0.99, "t")
    with pytest.raises(ValueError, match="hdi_low exceeds hdi_high"):
        forest_plot(given.assign(hdi_low=[0.5, 0.0]), rope, 0.99, "t")
    with pytest.raises(ValueError, match="rope must be"):
        forest_plot(draws, (0.15, -0.15), 0.99, "t")
    with pytest.raises(ValueError, match="at least 2 finite draws"):
        forest_plot({"H2": np.array([0.1, np.nan])}, rope, 0.99, "t")


def test_delta_by_depth_plot_and_markdown():
    rows = [{"agent": a, "content": c, "depth_tokens": t, "mean": 0.1 * i, "low": 0.1 * i - 0.05,
             "high": 0.1 * i + 0.05}
            for i, (a, c, t) in enumerate(itertools.product(LEVELS["agent"], LEVELS["content"], (0, 256, 512)))]
    png = delta_by_depth_plot(pd.DataFrame(rows))
    assert png.startswith(PNG_MAGIC)
    md = markdown_image(png, "Δ by [depth]")
    assert md.startswith("![Δ by (depth)](data:image/png;base64,")
    assert base64.b64decode(md[md.index(",") + 1:-1]) == png
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['high'\]"):
        delta_by_depth_plot(pd.DataFrame(rows).drop(columns="high"))
    with pytest.raises(ValueError, match="PNG signature"):
        markdown_image(b"GIF89a", "not a png")
