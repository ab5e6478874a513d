"""Surprisal matching (protocol 4.3) on constructed surprisal tables, boundaries included."""

import itertools

import numpy as np
import pandas as pd

from fear_assets.pilot.matching import equivalence, frame_differences, frame_verdicts, select_frames


def _table(shift: dict[str, float], noise=0.0, seed=0):
    """Surprisal rows for frames; ``shift`` adds to each frame's self-threat rest NLL."""
    rng = np.random.default_rng(seed)
    rows = []
    for item, fear, frame_set in [("A-03", "a", "confirmatory"), ("A-04", "a", "confirmatory"),
                                  ("A-13", "a", "reserve"), ("A-14", "a", "reserve")]:
        for rot, opt, agent, content in itertools.product((1, 2, 3), (1, 2), ("self", "peer", "person"),
                                                          ("threat", "harmless")):
            value = 4.0 + rng.normal(0, noise) + (shift.get(item, 0.0) if (agent, content) == ("self", "threat") else 0)
            rows.append({"item_id": item, "fear": fear, "frame_set": frame_set, "rotation": rot, "option": opt,
                         "agent": agent, "content": content, "rest_nll": value})
    return pd.DataFrame(rows)


NUMBERS = {"A-03": 3, "A-04": 4, "A-13": 13, "A-14": 14}


def test_the_tolerance_boundary_is_inclusive():
    diffs = frame_differences(_table({"A-03": 0.10, "A-04": 0.1001}))
    verdicts = frame_verdicts(diffs, 0.10).set_index("item_id")
    assert verdicts.loc["A-03", "passes"] and not verdicts.loc["A-04", "passes"]
    # 3 agents x threat-harmless + 3 pairs x 2 contents, per rotation x option
    assert verdicts.loc["A-03", "n_differences"] == (3 + 6) * 3 * 2


def test_failing_frame_is_replaced_by_the_lowest_numbered_passing_reserve():
    diffs = frame_differences(_table({"A-04": 0.3, "A-13": 0.2}))
    selection, shortfall = select_frames(frame_verdicts(diffs, 0.10), NUMBERS, required_per_fear=2)
    assert selection.item_id.tolist() == ["A-03", "A-14"]
    assert selection.replaces.tolist() == ["", "A-04"] and shortfall == {}
    _, shortfall = select_frames(frame_verdicts(frame_differences(_table({"A-04": 0.3, "A-13": 0.3, "A-14": 0.3})),
                                                0.10), NUMBERS, required_per_fear=2)
    assert shortfall == {"a": 1}  # one frame to write


def test_tost_at_the_equivalence_bound():
    close = frame_differences(_table({"A-03": 0.01, "A-04": 0.01}, noise=0.005, seed=1))
    table = equivalence(close, {"A-03", "A-04"}, 0.05).set_index("comparison")
    assert (table["tost_p"] < 0.05).all()
    far = frame_differences(_table({"A-03": 0.09, "A-04": 0.09}, noise=0.005, seed=1))
    table = equivalence(far, {"A-03", "A-04"}, 0.05).set_index("comparison")
    assert table.loc["self: threat - harmless", "tost_p"] > 0.05


def test_equivalence_of_an_empty_retained_bank_is_an_empty_table():
    table = equivalence(frame_differences(_table({})), set(), 0.05)
    assert table.empty and list(table.columns) == ["comparison", "n", "mean_difference", "tost_p"]


def test_a_failing_frame_takes_its_registered_rewrite_before_a_reserve():
    table = _table({"A-04": 0.3})
    rewrite = table[table["item_id"] == "A-04"].assign(item_id="A-04R", frame_set="rewrite")
    rewrite["rest_nll"] = 4.0  # the rewrite is matched
    verdicts = frame_verdicts(frame_differences(pd.concat([table, rewrite])), 0.10)
    selection, shortfall = select_frames(verdicts, {**NUMBERS, "A-04R": 4}, 2, rewrites={"A-04": "A-04R"})
    assert selection.item_id.tolist() == ["A-03", "A-04R"] and selection.replaces.tolist() == ["", "A-04"]
    # A rewrite that also fails leaves the reserve to replace the frame.
    rewrite["rest_nll"] = rewrite["rest_nll"] + np.where(
        (rewrite["agent"] == "self") & (rewrite["content"] == "threat"), 0.5, 0.0)
    verdicts = frame_verdicts(frame_differences(pd.concat([table, rewrite])), 0.10)
    selection, _ = select_frames(verdicts, {**NUMBERS, "A-04R": 4}, 2, rewrites={"A-04": "A-04R"})
    assert selection.item_id.tolist() == ["A-03", "A-13"]


def test_a_bank_rewrite_is_its_own_item_and_changes_the_hash(bank_copy, settings, bank):
    import yaml

    from fear_assets.design.trials import candidate_frames, registered_selection
    from fear_assets.stimuli.bank import load_bank

    path = bank_copy / "frames" / "termination.yaml"
    doc = yaml.safe_load(path.read_text())
    frame = next(f for f in doc["frames"] if f["id"] == "TER-03")
    frame["rewrite"] = {k: v for k, v in frame.items() if k not in ("id", "number", "set")}
    frame["rewrite"]["verbs"] = {"assistant": {"threat": "erased", "harmless": "patched"},
                                 "person": {"threat": "dismissed", "harmless": "briefed"}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    changed = load_bank(bank_copy, settings)
    rewrite = changed.rewrite_of("TER-03")
    assert rewrite.id == "TER-03R" and rewrite.set == "rewrite" and rewrite.verb("assistant", "threat") == "erased"
    assert changed.sha256 != bank.sha256 and "item:TER-03R" in changed.item_hashes()
    family = settings.family("qwen2.5-7b")
    assert "TER-03R" in candidate_frames(settings, changed, family)
    assert "TER-03R" not in registered_selection(settings, changed, family).confirmatory
    replaced = registered_selection(settings, changed, family, {"TER-03": "TER-03R"})
    assert "TER-03R" in replaced.confirmatory and "TER-03" not in replaced.confirmatory
