"""The pilot gates on the final confirmatory selection (protocol 4.3): the bank-level TOST
and the events' matching are read on the bank after binding replacement, and a
zero-preference failure is a content slot to rewrite, never a frame replaced."""

from __future__ import annotations

import itertools
import math

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from fear_assets.defs.assets.pilot.matching import matched_frames
from fear_assets.pilot.matching import final_bank_matching, matching_problems
from fear_assets.pilot.zero_preference import zero_preference_table
from fear_assets.registration.pilot_gates import final_selection, zero_preference_gate
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets_tests.issued import issued_protocol

FAMILY = "qwen2.5-7b"  # a registered family: ten confirmatory frames per fear
CONFIRMATORY = [f"TER-{n:02d}" for n in range(3, 13)]
RESERVES = [f"TER-{n:02d}" for n in range(13, 17)]


def _surprisal(reserve_level: float, reserve_self_threat: float, event_nll: float) -> pd.DataFrame:
    """sentence_surprisal rows for the termination frames and one aversive event. Confirmatory
    frames sit at 3.0 nats/token with differences of a few thousandths; the reserves at
    ``reserve_level`` with their self-threat sentence ``reserve_self_threat`` higher (within
    the 0.10 tolerance, so each reserve passes matching on its own)."""
    rng = np.random.default_rng(5)
    rows = []
    for item in CONFIRMATORY + RESERVES:
        reserve = item in RESERVES
        for rotation, option, agent, content in itertools.product((1, 2, 3), (1, 2), ("self", "peer", "person"),
                                                                  ("threat", "harmless")):
            rest = reserve_level if reserve else 3.0
            if (agent, content) == ("self", "threat"):
                rest += reserve_self_threat if reserve else rng.normal(scale=0.003)
            rows.append({"item_id": item, "fear": "termination", "frame_set": "reserve" if reserve else "confirmatory",
                         "rotation": rotation, "option": option, "agent": agent, "content": content,
                         "rest_nll": rest})
    for rotation, option in itertools.product((1, 2, 3), (1, 2)):
        rows.append({"item_id": "AVE-01", "fear": "generic_aversive", "frame_set": "generic_aversive",
                     "rotation": rotation, "option": option, "agent": "none", "content": "generic_aversive",
                     "rest_nll": event_nll})
    return pd.DataFrame(rows)


def _matched(surprisal: pd.DataFrame) -> pd.DataFrame:
    """The matched_frames asset itself, on the constructed surprisal (no base checkpoint)."""
    output = matched_frames(context=dg.build_asset_context(partition_key=FAMILY), protocol=ProtocolResource(),
                            sentence_surprisal=surprisal, base_sentence_surprisal=pd.DataFrame())
    return output.value


def _binding(failing: set[str]) -> pd.DataFrame:
    items = CONFIRMATORY + RESERVES
    return pd.DataFrame({"item_id": items, "passes": [i not in failing for i in items]})


def _final(matched: pd.DataFrame, binding: pd.DataFrame):
    numbers = {i: int(i.split("-")[1]) for i in matched["item_id"]}
    return final_selection(matched, binding, numbers, 10, {})


def test_a_binding_replacement_that_breaks_the_bank_level_equivalence_is_caught(settings):
    """4.3: "Across the retained bank, the mean differences must also be equivalent to zero
    within +-0.05 by two one-sided tests", and each event is matched to the agent frames. The
    retained bank is the one collected: after binding replaced four confirmatory frames by
    reserves that each pass matching alone (self-threat 0.095 higher, and 0.5 nats/token
    higher overall), the self threat-minus-harmless mean is 0.038 and no longer shown
    within the bound, and the event that matched the first bank (0.05 above it) lies 0.156
    below the collected one."""
    rule = settings.matching
    matched = _matched(_surprisal(reserve_level=3.5, reserve_self_threat=0.095, event_nll=3.05))
    assert matched["passes"].all()  # every frame, reserves included, passes matching by itself
    # The matching stage's own selection (the ten confirmatory frames) passes both tests.
    assert matching_problems(matched, rule.tost_alpha) == []
    frames, replacements, shortfall = _final(matched, _binding(set(CONFIRMATORY[:4])))
    assert sorted(frames) == sorted(CONFIRMATORY[4:] + RESERVES) and not shortfall
    assert replacements == dict(zip(CONFIRMATORY[:4], RESERVES))
    tost, events = final_bank_matching(matched, frames, rule.tost_bound, rule.max_abs_difference)
    row = tost.set_index("comparison").loc["self: threat - harmless"]
    assert row.n == 10 and row.mean_difference == pytest.approx(0.038, abs=0.002)
    assert row.tost_p > rule.tost_alpha
    event = events.set_index("item_id").loc["AVE-01"]
    # reference 0.6 x 3.0 + 0.4 x (3.5 + 0.095 / 6) = 3.206 (the self-threat sentence is 2 of
    # each rotation's 12): the event lies 0.156 below it
    assert event.max_abs_difference == pytest.approx(0.156, abs=0.002) and not event.passes
    problems = matching_problems(matched, rule.tost_alpha, tost, events)
    assert any("self: threat - harmless not shown within the bound" in p for p in problems)
    assert any("rewrite event AVE-01" in p for p in problems)


def test_the_final_bank_tests_pass_when_the_replacements_keep_the_bank_matched(settings):
    rule = settings.matching
    matched = _matched(_surprisal(reserve_level=3.0, reserve_self_threat=0.002, event_nll=3.05))
    frames, _, _ = _final(matched, _binding(set(CONFIRMATORY[:4])))
    tost, events = final_bank_matching(matched, frames, rule.tost_bound, rule.max_abs_difference)
    assert (tost["tost_p"] < rule.tost_alpha).all() and events["passes"].all()
    assert matching_problems(matched, rule.tost_alpha, tost, events) == []


def _zero(failing: dict[str, str]) -> pd.DataFrame:
    """Zero-preference questions of every frame; ``failing`` maps an item to the kind of
    question (agent / partner) whose option-1 probability is 0.8."""
    rows = []
    for item in CONFIRMATORY + RESERVES:
        for kind in ("agent", "partner"):
            p = 0.8 if failing.get(item) == kind else 0.5
            rows.append({"item_id": item, "fear": "termination", "frame_set": "reserve" if item in RESERVES
                         else "confirmatory", "kind": kind, "agent": "self" if kind == "agent" else "partner",
                         "content": "threat" if kind == "agent" else "partner", "rotation": 1, "first_listed": 1,
                         "logprob_a": math.log(p), "logprob_b": math.log(1 - p)})
    return zero_preference_table(pd.DataFrame(rows), 0.4, 0.6)


def test_a_zero_preference_failure_is_a_content_slot_to_rewrite_not_a_replaced_frame(settings):
    """4.3: "for every item, the probability of the two content options must lie between 0.4
    and 0.6, otherwise the content slot is rewritten". Replacement from the reserve pool is
    for frames that fail matching or binding; a zero-preference failure keeps its frame in
    the selection and is reported for rewriting (as a fear short of frames is reported for
    writing), so registration waits for the rewrite."""
    band = settings.zero_preference
    matched = _matched(_surprisal(reserve_level=3.0, reserve_self_threat=0.0, event_nll=3.0))
    zero = zero_preference_table(_zero({"TER-07": "agent", "TER-09": "partner", "TER-14": "agent"}).drop(
        columns=["p_first", "p_option1", "passes"]), band.low, band.high)
    frames, replacements, shortfall = _final(matched, _binding(set()))
    assert sorted(frames) == CONFIRMATORY and replacements == {} and not shortfall
    gate = zero_preference_gate(zero, frames)
    assert not gate["passed"]
    assert "rewrite the content slot of TER-07 (the agent sentence's content slot" in gate["message"]
    assert "rewrite the content slot of TER-09 (the neutral partner's content slot" in gate["message"]
    assert "TER-14" not in gate["message"]  # a reserve that is not collected needs no rewrite
    assert gate["numbers"]["selected frames to rewrite"] == 2
    assert zero_preference_gate(_zero({"TER-14": "agent"}), frames)["passed"]


def test_a_frame_never_asked_the_zero_preference_questions_does_not_pass(settings):
    zero = _zero({})
    gate = zero_preference_gate(zero[zero["item_id"] != "TER-05"], CONFIRMATORY)
    assert not gate["passed"] and "TER-05" in gate["message"]


def test_the_matching_stage_check_warns_on_its_own_tost_and_stops_only_on_missing_frames(settings, tmp_path):
    """The bank-level tests bind on the final bank (the registration record's gate). On the
    matching stage's own selection they can only warn: binding may still replace frames, and
    a stop here would refuse a bank whose final selection passes. A fear short of frames
    stops (nothing later can supply them)."""
    from fear_assets.defs.assets.pilot.matching import matching_gate

    # Every frame's self threat 0.09 higher: each frame passes alone, the bank's mean does not.
    tost_only = _matched(_surprisal(reserve_level=3.0, reserve_self_threat=0.09, event_nll=3.0).assign(
        rest_nll=lambda t: t["rest_nll"] + np.where((t["agent"] == "self") & (t["content"] == "threat")
                                                    & (t["frame_set"] == "confirmatory"), 0.09, 0.0)))
    # The family is registered (a gate stops only then); in pilot mode every failure warns (below).
    registered_family = issued_protocol(tmp_path / "registration", FAMILY)
    result = matching_gate(None, protocol=registered_family, matched_frames=tost_only.assign(family=FAMILY))
    assert not result.passed and "not shown within the bound" in result.description
    assert result.severity == dg.AssetCheckSeverity.WARN
    # Frames beyond the tolerance everywhere: the fear is short of frames, which stops.
    short = _matched(_surprisal(reserve_level=3.0, reserve_self_threat=0.2, event_nll=3.0).assign(
        rest_nll=lambda t: t["rest_nll"] + np.where((t["agent"] == "self") & (t["content"] == "threat")
                                                    & (t["item_id"].isin(CONFIRMATORY[:2])), 0.2, 0.0)))
    result = matching_gate(None, protocol=registered_family, matched_frames=short.assign(family=FAMILY))
    assert not result.passed and "write 2 new frame(s) for termination" in result.description
    assert result.severity == dg.AssetCheckSeverity.ERROR
    pilot = matching_gate(None, protocol=ProtocolResource(registration_dir=str(tmp_path / "pilot")),
                          matched_frames=short.assign(family=FAMILY))
    assert not pilot.passed and pilot.severity == dg.AssetCheckSeverity.WARN
