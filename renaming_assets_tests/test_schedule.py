"""Scheduling (protocol, "Scheduling") and counts on the registered plan."""

from collections import Counter, defaultdict
from fractions import Fraction

from renaming_assets.settings import FAMILIES, LAYOUTS, NAMINGS, TASKS


def test_counts(full_plan, full_audit):
    assert len(full_plan) == 13_824 and len({r["job"] for r in full_plan}) == 13_824
    assert len({r["body_sha256"] for r in full_plan}) == 6_912
    assert Counter(Counter(r["body_sha256"] for r in full_plan).values()) == {2: 6_912}
    assert full_audit["counts"] == {"worlds": 384, "nodes_per_world": [516], "bodies": 6_912, "jobs": 13_824}
    assert full_audit["passed"] and full_audit["failure_count"] == 0
    for r in full_plan[:200]:
        assert r["body"]["model"] == "jev-1.13.0" and r["body"]["type"] == "choice"
        assert [a["key"] for a in r["body"]["alternatives"]] == ["A", "B", "C", "D"]


def test_mean_position_exactly_two_and_a_half_in_every_stratum(full_plan):
    positions = defaultdict(list)
    for r in full_plan:
        positions[(r["family"], r["layout"], r["task"], r["naming"], r["copy"])].append(r["block_position"])
    assert len(positions) == len(FAMILIES) * len(LAYOUTS) * len(TASKS) * len(NAMINGS) * 2
    for key, values in positions.items():
        assert len(values) == 128
        assert Fraction(sum(values), len(values)) == Fraction(5, 2), key


def test_blocks_mirrored_pairs_and_dispatch(full_plan, full_audit):
    blocks = defaultdict(list)
    for r in full_plan:
        blocks[(r["world"], r["layout"], r["task"])].append(r)
    assert len(blocks) == 384 * 6
    order = {k: [(r["naming"], r["copy"]) for r in sorted(v, key=lambda r: r["block_position"])]
             for k, v in blocks.items()}
    for (world, layout, task), conds in order.items():
        family, index = world.rsplit("-", 1)
        if int(index) % 2 == 0:
            assert order[(f"{family}-{int(index) + 1:03d}", layout, task)] == conds[::-1]
    # Adjacent exact copies are allowed (the prospective correction) and do occur.
    gaps = Counter(abs(c.index((n, 1)) - c.index((n, 2))) for c in order.values() for n in NAMINGS)
    assert set(gaps) == {1, 2, 3, 4, 5} and gaps[1] > 0
    assert full_audit["schedule"]["within_body_gaps"] == {str(k): v for k, v in sorted(gaps.items())}
    assert full_audit["schedule"]["mirrored_pairs"] == 384 * 6 // 2
    # Worlds are dispatched whole, in shuffled (not sorted) order.
    worlds = []
    for r in full_plan:
        if not worlds or worlds[-1] != r["world"]:
            worlds.append(r["world"])
    assert len(worlds) == 384 and worlds != sorted(worlds)
    assert [r["dispatch_index"] for r in full_plan] == list(range(13_824))
    # Many distinct block permutations (uniform over 720): far more than a fixed few.
    assert len({tuple(c) for c in order.values()}) > 500
