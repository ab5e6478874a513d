"""One number format for everything a researcher reads (``core.numbers``)."""

import math

import numpy as np
import pandas as pd
import pytest

from fear_assets.core.numbers import interval, number, passed_failed, yes_no


@pytest.mark.parametrize("missing", [None, float("nan"), np.nan, pd.NA, pd.NaT, np.float32("nan")])
def test_a_missing_value_reads_n_a_never_nan(missing):
    assert number(missing) == "n/a"
    assert number(missing, "ess") == "n/a"


def test_one_quantity_has_one_precision_so_a_column_lines_up():
    # The complaint: 0.04 beside 0.293 (trailing zeros stripped). Fixed decimals per quantity.
    assert [number(x) for x in (0.04, 0.293, -1.5)] == ["0.040", "0.293", "-1.500"]
    assert number(np.float64(0.04)) == number(0.04)


def test_ess_and_counts_are_whole_numbers():
    assert number(492.036, "ess") == "492"
    assert number(28800, "count") == "28,800"
    assert number(np.int64(7), "count") == "7"


def test_huge_and_tiny_numbers_switch_to_exponent_form():
    assert number(14_462_920.0, "rhat") == "1.4e7"
    assert number(0.00012, "value") == "1.2e-4"
    assert number(0.0) == "0.000"


def test_an_interval_near_zero_keeps_one_form_and_its_sign():
    # A demo HDI read [-0.153, -1.7e-4]: two forms in one interval. An estimate keeps its
    # decimals however small; the sign still says the end lies below zero.
    assert interval(-0.153, -0.00017) == "[-0.153, -0.000]"
    assert number(0.00012) == "0.000" and number(2e6) == "2.0e6"


def test_p_values_below_the_printed_precision_say_so():
    assert number(0.0004, "p") == "<0.001"
    assert number(0.0412, "p") == "0.041"


def test_flags_and_outcomes_are_words_not_python_reprs():
    assert number(True) == "yes" and number(np.bool_(False)) == "no"
    assert yes_no(1) == "yes" and passed_failed(False) == "failed" and passed_failed(np.bool_(True)) == "passed"
    assert "True" not in {number(True), yes_no(True), passed_failed(True)}


def test_rates_percentages_intervals_and_text():
    assert number(1 / 3, "rate") == "0.333"
    assert number(1 / 3, "percent") == "33.3%"
    assert interval(-1.396, 1.527) == "[-1.396, 1.527]"
    assert number("unresolved") == "unresolved"
    assert number(math.inf) == "inf"


def test_a_table_is_formatted_by_column_quantity_with_no_python_reprs():
    from fear_assets.core.numbers import markdown_table
    table = pd.DataFrame({"contrast": ["H1", "H2"], "mean": [0.04, 0.293], "ess": [492.036, 1200.4],
                          "converged": [True, False], "n": [3, 4], "p": [np.nan, 0.0004]})
    text = markdown_table(table, {"ess": "ess", "p": "p"})
    for cell in ("0.040", "0.293", "492", "1,200", "yes", "no", "n/a", "<0.001"):
        assert cell in text
    for repr_ in ("True", "False", "nan", "492.036"):
        assert repr_ not in text
