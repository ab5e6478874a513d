"""The world statistic, its range and expectation, resampling, Holm, validity rules."""

import itertools
import math

import pytest

from renaming_assets.analyzer.statistics import (equal_family_mean, excess, holm, sign_flip_p,
                                                 stratified_bootstrap)
from renaming_assets.analyzer.validity import argmax_mismatch, label_failure, probability_vector
from renaming_assets.precision import exact_moments, precision_plan
from renaming_assets.settings import SETTINGS, stream

KEYS = ["A", "B", "C", "D"]


def test_excess_range_is_minus_half_to_one():
    values = {excess(*labels) for labels in itertools.product(KEYS, repeat=4)}
    assert min(values) == -0.5 and max(values) == 1.0
    assert excess("A", "B", "A", "A") == 0.0 and excess("A", "B", "C", "C") == 0.5
    assert excess("A", "B", "A", "B") == -0.5 and excess("A", "A", "B", "B") == 1.0


def _enumerate(p, q):
    # Independent of precision.py: the sum over all 4^4 outcomes, written out.
    total = 0.0
    for a1, a2, b1, b2 in itertools.product(range(4), repeat=4):
        c = ((a1 != b1) + (a1 != b2) + (a2 != b1) + (a2 != b2)) / 4
        r = ((a1 != a2) + (b1 != b2)) / 2
        total += p[a1] * p[a2] * q[b1] * q[b2] * (c - r)
    return total


def test_expectation_is_half_squared_l2_under_independent_exchangeable_copies():
    rng = stream("test", "dirichlet")
    cases = [(p, q) for _, p, q in SETTINGS.precision.hypothetical]
    for _ in range(50):
        p = [rng.expovariate(1) for _ in KEYS]
        q = [rng.expovariate(1) for _ in KEYS]
        cases.append(([x / sum(p) for x in p], [x / sum(q) for x in q]))
    for p, q in cases:
        half_sq = sum((x - y) ** 2 for x, y in zip(p, q)) / 2
        assert _enumerate(p, q) == pytest.approx(half_sq, abs=1e-12)
        assert exact_moments(tuple(p), tuple(q), tuple(KEYS))["mean"] == pytest.approx(half_sq, abs=1e-12)


def test_precision_plan_matches_the_protocol():
    plan = precision_plan(SETTINGS)
    assert plan["bonferroni_two_sided_z"] == pytest.approx(2.2414, abs=1e-4)
    power = {r["sd"]: r["power_at_smallest_effect"] for r in plan["by_world_sd"]}
    assert list(power) == [0.20, 0.35, 0.50, 0.75]
    assert power[0.50] == pytest.approx(0.95, abs=0.01) and power[0.75] == pytest.approx(0.64, abs=0.01)
    assert plan["worst_case_sd_bound"] == 0.75
    for h in plan["hypothetical_categorical"]:
        assert h["mean"] == pytest.approx(h["half_squared_l2"], abs=1e-12)


def test_resampling_and_holm():
    zeros = {"a": [0.0] * 10, "b": [0.0] * 10, "c": [0.0] * 10}
    assert sign_flip_p(zeros, 999, stream("t", 1)) == 1.0
    strong = {"a": [0.5] * 40, "b": [0.4] * 40, "c": [0.6] * 40}
    assert sign_flip_p(strong, 999, stream("t", 2)) == pytest.approx(1 / 1000)
    assert stratified_bootstrap(strong, 200, 0.95, stream("t", 3)) == pytest.approx((0.5, 0.5))
    mixed = {"a": [1.0, -0.5, 0.25, 0.0], "b": [0.5, 0.5], "c": [-0.5, 1.0, 0.0]}
    lo, hi = stratified_bootstrap(mixed, 2000, 0.95, stream("t", 4))
    assert lo < equal_family_mean(mixed) < hi
    assert equal_family_mean({"a": [1.0], "b": [], "c": [0.0]}) is None
    assert holm({"x": 0.01, "y": 0.04}, 2) == {"x": 0.02, "y": 0.04}
    assert holm({"x": 0.03, "y": 0.02}, 2) == {"x": 0.04, "y": 0.04}
    assert holm({"x": 0.01, "y": None}, 2) == {"x": 0.02, "y": None}


def _response(**changes):
    r = {"http_status": 200, "error": None, "validated_success": True, "model": "jev-1.13.0",
         "answer_type": "choice", "selected": "B", "probabilities": {"A": 0.1, "B": 0.6, "C": 0.2, "D": 0.1}}
    r.update(changes)
    return r


def test_label_validity_conditions():
    assert label_failure(_response(), KEYS, SETTINGS) is None
    for change, category in [({"http_status": 201}, "http_status"), ({"error": "x"}, "error"),
                             ({"validated_success": None}, "validated_success"),
                             ({"validated_success": "true"}, "validated_success"),
                             ({"model": "jev-1.14.0"}, "model"), ({"answer_type": "text"}, "answer_type"),
                             ({"selected": "E"}, "selected"), ({"selected": 1}, "selected")]:
        assert label_failure(_response(**change), KEYS, SETTINGS) == category
    assert label_failure(None, KEYS, SETTINGS) == "no_response"


def test_probability_vector_rules():
    assert probability_vector(_response(), KEYS, SETTINGS) == (0.1, 0.6, 0.2, 0.1)
    ok = {"A": 0.26, "B": 0.26, "C": 0.25, "D": 0.25}  # total 1.02: cent rounding, accepted
    assert probability_vector(_response(probabilities=ok), KEYS, SETTINGS) is not None
    for bad in ({"A": 0.27, "B": 0.26, "C": 0.25, "D": 0.25},  # total 1.03
                {"A": 0.5, "B": 0.5, "C": 0.0},  # missing coordinate stays missing
                {"A": math.nan, "B": 0.5, "C": 0.25, "D": 0.25}, {"A": -0.1, "B": 0.6, "C": 0.25, "D": 0.25},
                {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25, "E": 0.0}):
        assert probability_vector(_response(probabilities=bad), KEYS, SETTINGS) is None
    # An invalid map does not erase a valid label.
    assert label_failure(_response(probabilities={"A": 2}), KEYS, SETTINGS) is None
    assert argmax_mismatch("A", (0.1, 0.6, 0.2, 0.1), KEYS) and not argmax_mismatch("B", (0.1, 0.6, 0.2, 0.1), KEYS)
