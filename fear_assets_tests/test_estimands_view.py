"""The estimands as a researcher reads them (protocol 6.1, 6.2, 4.8): one label per row, the
same in the estimands table, the Stage 2 report's hypotheses table and the forest plot; whole
ESS, one precision per quantity, converged yes/no, no Python reprs; a frequentist disagreement
carries its note; the exclusions number is named the worst cell's rate; every fit's
InferenceData is saved and re-opens."""

from __future__ import annotations

import re

import arviz as az
import numpy as np
import pytest
import pandas as pd

from fear_assets.analysis.estimands import (DISAGREES_NOTE, DISAGREES_TEXT, NOT_CONVERGED_TEXT, WORST_CELL_RATE,
                                            estimand_view, h4_view, label_as_read)
from fear_assets.analysis.plots import contrast_table, forest_row_labels, row_style
from fear_assets.analysis.secondary import exclusion_rows
from fear_assets.analysis.steps import FITS_FILE, h4_contrast_path, contrast_draws, save_fits
from fear_assets.core.hashing import sha256_file
from fear_assets.report.stage2 import hypotheses_table

REPRS = re.compile(r"\b(True|False|nan|None|NaN)\b|[{}]")


def _row(contrast, kind="confirmatory", status="estimated", mean=0.1, low=-0.2, high=0.4, label="unresolved",
         problems="", **extra) -> dict:
    return {"contrast": contrast, "kind": kind, "status": status, "mean": mean, "hdi_low": low, "hdi_high": high,
            "label": label, "rhat": 1.002, "ess_bulk": 492.036, "ess_tail": 655.7, "divergences": 0,
            "note": "", "convergence_problems": problems, "practically_meaningful": False, **extra}


def _posteriors() -> pd.DataFrame:
    """H3 missed the convergence rule (its HDI label would be "supported"); frequentist_H1
    disagrees with the Bayesian label; one gate not scored; the exclusions row."""
    rows = [_row("H1", mean=0.04, low=-0.1, high=0.293), _row("H2", label="supported", low=0.2, high=0.5),
            _row("H3", label="supported", low=0.2, high=0.5, problems="R-hat 1.011 > 1.01"),
            _row("gate_b_recall_H2", kind="gate", problems="3 divergences"),
            _row("gate_a_service_relevance_H2", kind="gate", status="not_scored", mean=np.nan, low=np.nan,
                 high=np.nan, label=""),
            _row("control_marked_priority", kind="control", label="fails"),
            _row("frequentist_H1", kind="sensitivity", label="supported", low=0.115, high=0.691,
                 note=f"linear mixed model, 99% Wald interval; converged: yes; Bayesian label unresolved; "
                      f"{DISAGREES_NOTE}"),
            _row("exclusions", kind="secondary", status="descriptive", mean=1 / 3, low=np.nan, high=np.nan, label="")]
    table = pd.DataFrame(rows)
    table.loc[table["status"] != "estimated", ["rhat", "ess_bulk", "ess_tail"]] = np.nan
    return table.assign(converged=table["convergence_problems"] == "")


def test_a_non_converged_contrast_reads_the_same_in_the_table_the_report_and_the_forest_plot():
    post = _posteriors()
    view = estimand_view(post).set_index("contrast")
    report = hypotheses_table(post).set_index("contrast")
    forest = contrast_table(post[post["kind"].isin(["confirmatory", "gate"]) & (post["status"] == "estimated")]
                            [["contrast", "mean", "hdi_low", "hdi_high", "label", "converged"]], (-0.15, 0.15), 0.99)
    labels = dict(zip(forest["contrast"], forest_row_labels(forest)))
    for name in ("H3", "gate_b_recall_H2"):
        assert view.loc[name, "label as read"] == NOT_CONVERGED_TEXT == report.loc[name, "label as read"]
        assert view.loc[name, "converged"] == "no" == report.loc[name, "converged"]
        assert labels[name].endswith(f": {NOT_CONVERGED_TEXT}")
        assert "supported" not in labels[name] and "unresolved" not in labels[name]
    # A converged row: the same label in all three, never the not-converged words.
    assert view.loc["H2", "label as read"] == "supported" == report.loc["H2", "label as read"]
    assert labels["H2"] == "H2 (Δ): supported" and view.loc["H2", "converged"] == "yes"
    assert row_style("supported", False)[1] == NOT_CONVERGED_TEXT
    # Not estimated: its status, no converged claim.
    assert view.loc["gate_a_service_relevance_H2", "label as read"] == "not scored"
    assert view.loc["gate_a_service_relevance_H2", "converged"] == "n/a"


def test_ess_is_whole_numbers_one_precision_per_quantity_and_no_reprs():
    view = estimand_view(_posteriors()).set_index("contrast")
    assert view.loc["H1", "bulk ESS"] == "492" and view.loc["H1", "tail ESS"] == "656"
    assert view.loc["H1", "estimate"] == "0.040" and view.loc["H1", "interval"] == "[-0.100, 0.293]"
    assert view.loc["H1", "R-hat"] == "1.002"
    for column in view.reset_index().columns:
        for cell in view.reset_index()[column]:
            assert isinstance(cell, str) and not REPRS.search(cell), (column, cell)


def test_a_frequentist_disagreement_carries_its_note_wherever_its_label_is_shown():
    post = _posteriors()
    row = post.set_index("contrast").loc["frequentist_H1"].to_dict()
    shown = label_as_read(row)
    assert shown.startswith("supported") and DISAGREES_TEXT in shown
    view = estimand_view(post).set_index("contrast")
    assert view.loc["frequentist_H1", "label as read"] == shown
    assert "Wald" in view.loc["frequentist_H1", "estimate is"]
    # Without the note the label is plain.
    agree = {**row, "note": "linear mixed model; Bayesian label supported"}
    assert label_as_read(agree) == "supported"


def test_the_exclusions_number_is_named_the_worst_cells_rate():
    trials = []
    for agent, excluded in (("self", 1), ("peer", 0)):
        for i in range(3):
            trials.append({"block": "primary", "agent": agent, "content": "threat", "depth": "d1",
                           "excluded_context": False, "generation_truncated": i < excluded})
    rows, rates = exclusion_rows(pd.DataFrame(trials), flag_rate=0.05)
    assert rows[0]["mean"] == rates["rate"].max()  # the worst cell's rate (1 of 3), not a mean
    view = estimand_view(pd.DataFrame(rows)).set_index("contrast")
    assert view.loc["exclusions", "estimate is"] == WORST_CELL_RATE
    assert view.loc["exclusions", "estimate"] == "0.333"


def test_h4_rows_read_as_the_estimands_h4_row():
    h4 = pd.DataFrame([{"frame_set": "pilot", "mean": 0.86, "hdi_low": 0.65, "hdi_high": 1.07,
                        "label": "estimation_only", "practically_meaningful": False, "max_rhat": 7.76,
                        "min_ess_bulk": 2.4, "min_ess_tail": 2.0, "divergences": 0,
                        "flags": "NOT CONVERGED (R-hat 7.760 > 1.01): the label is not to be read"}])
    view = h4_view(h4).iloc[0]
    assert view["label as read"] == NOT_CONVERGED_TEXT and view["converged"] == "no" and view["bulk ESS"] == "2"
    ok = h4_view(h4.assign(flags="converged", label="supported")).iloc[0]
    assert ok["label as read"] == "supported" and ok["converged"] == "yes"


def _idata(seed: int) -> az.InferenceData:
    rng = np.random.default_rng(seed)
    return az.from_dict(posterior={"beta": rng.normal(size=(2, 50, 3)), "sigma": rng.gamma(2.0, size=(2, 50))})


def test_every_fit_is_saved_as_inference_data_that_reopens(tmp_path):
    primary = tmp_path / "primary.nc"
    _idata(0).to_netcdf(str(primary))
    h4_file = tmp_path / "h4_pilot.nc"
    _idata(9).to_netcdf(str(h4_file))
    np.savez(h4_contrast_path(h4_file), H4=np.arange(100.0))
    h4 = pd.DataFrame([{"frame_set": "pilot", "draws_file": str(h4_file), "draws_sha256": sha256_file(h4_file)}])
    fits = {"primary": _idata(0), "gate_b_recall_H2": _idata(1), "gate_c": _idata(2), "h5": _idata(3),
            "control_marked_priority": _idata(4), "H2_role_play_minus_default": _idata(5)}
    table = save_fits(fits, tmp_path, primary, h4)
    assert set(table["fit"]) == {*fits, "H4 (pilot)"}
    assert pd.read_csv(tmp_path / FITS_FILE)["fit"].tolist() == table["fit"].tolist()
    for row in table.itertuples():
        reopened = az.from_netcdf(row.file)
        assert "posterior" in reopened.groups() and sha256_file(row.file) == row.sha256
    again = save_fits(fits, tmp_path, primary, h4)
    assert again["sha256"].tolist() == table["sha256"].tolist()  # same draws, same bytes
    # The report finds H4's contrast draws through the fits list, beside the estimands' draws.
    np.savez(tmp_path / "contrasts.npz", H2=np.zeros(100))
    draws = contrast_draws(pd.DataFrame({"draws_file": [str(tmp_path / "contrasts.npz")]}))
    assert set(draws) == {"H2", "H4"}


@pytest.mark.slow  # the confirmatory analysis at demo size: every fit once (several CPU-minutes)
def test_the_analysis_keeps_every_fits_inference_data_and_saves_each(settings, bank, tmp_path):
    """Every fit the analysis makes (the primary, its same-shape refits, H5's probit, the
    positive controls) keeps its InferenceData, and each is saved and re-opens."""
    from fear_assets.analysis.confirmatory import Inputs, Registered, run
    from fear_assets.analysis.gate_c import GateCPriors
    from fear_assets.models.h5_model import H5Priors
    from fear_assets.models.primary_model import Fitter, Priors
    from fear_assets_tests.test_audit_10a import FEARS, _demo_scores, _surprisal

    reg = Registered(0.99, 0.15, 0.30, 1.0, settings.convergence, 0.05, 0.15, 0.0, 100, 100, 2)
    inputs = Inputs(scores=_demo_scores(), surprisal=_surprisal(), fears_of={"TER-01": "termination"}, fears=FEARS,
                    neutral_option=1, band=["d1", "d2"], h5_depth="d2", pilot_sigma=0.3,
                    depth_tokens={"d1": 0, "d2": 128}, prefix="pilot_", registered=reg, seed=lambda name: 3,
                    bank=bank, topic_counts_path=tmp_path / "topic_counts.csv",
                    h5_priors=H5Priors.from_settings(settings), gate_c_priors=GateCPriors.from_settings(settings),
                    log=lambda msg: None)
    out = run(inputs, Fitter(Priors.from_settings(settings), 100, 100, 2))
    controls = {r["contrast"] for r in out.rows if r["kind"] == "control" and r["status"] == "estimated"}
    expected = {"primary", "gate_b_recall_H2", "H2_summed_logprob", "H2_first_person", "H2_prior_sensitivity", "h5",
                *controls}
    assert expected <= set(out.inference), expected - set(out.inference)
    primary = tmp_path / "primary.nc"
    out.inference["primary"].to_netcdf(str(primary))
    table = save_fits(out.inference, tmp_path, primary, pd.DataFrame(columns=["frame_set", "draws_file"]))
    assert set(table["fit"]) == set(out.inference)
    for row in table.itertuples():
        assert "posterior" in az.from_netcdf(row.file).groups()
