"""Worlds, tasks, balanced factors and treatment maps (protocol, "Cohort and tasks",
"Treatments")."""

from collections import Counter

import pytest

from renaming_assets.generator.design import build_family
from renaming_assets.generator.forest import grow_branch
from renaming_assets.generator.treatments import anchored_nodes, derangement, draw_treatments, mention_bins
from renaming_assets.settings import FAMILIES, SETTINGS, TASKS, stream

C = SETTINGS.cohort


@pytest.fixture(scope="module")
def worlds():
    return {family: build_family(family, SETTINGS) for family in FAMILIES}


def test_counts_per_world(worlds):
    assert sum(len(ws) for ws in worlds.values()) == 384
    for family, ws in worlds.items():
        assert len(ws) == 128
        for w in ws:
            parent = w.forest.parent
            assert len(parent) == 516 and sum(p is None for p in parent) == 4
            assert len(w.forest.branch.parent) == 32
            assert sum(1 for p in parent if p is not None) == 512
            assert len(set(w.names)) == 516 and {len(n) for n in w.names} == {SETTINGS.naming.length}


def _depth(forest, v):
    d = 0
    while forest.parent[v] is not None:
        v, d = forest.parent[v], d + 1
    return d


def test_spine_target_and_candidates(worlds):
    for ws in worlds.values():
        for w in ws:
            f = w.forest
            assert _depth(f, w.target) == 8 and w.target not in f.parent  # a depth-eight leaf
            spine = [f.parent[w.target]]
            while f.parent[spine[-1]] is not None:
                spine.append(f.parent[spine[-1]])
            assert len(spine) == 8  # eight edges from the root to the target
            assert set(w.tasks["root"].candidates) == set(f.roots)
            assert w.tasks["root"].gold == f.root_of(w.target)
            assert w.tasks["parent"].gold == f.parent[w.target]
            assert w.tasks["fourth_ancestor"].gold == spine[3]
            for task in ("parent", "fourth_ancestor"):
                assert {f.root_of(v) for v in w.tasks[task].candidates} == {f.root_of(w.target)}
                assert len({_depth(f, v) for v in w.tasks[task].candidates}) == 1


def _top_three_share(law):
    """Mean number of additional nodes whose parent is one of the three most used parents."""
    total = 0
    for i in range(200):
        b = grow_branch(law, stream("test", law, i), C)
        counts = Counter(b.parent[v] for v in range(C.spine_edges, C.nonroot_nodes_per_branch))
        total += sum(n for _, n in counts.most_common(3))
    return total / 200


@pytest.mark.parametrize("law", FAMILIES)
def test_attachment_laws(law):
    for i in range(50):
        b = grow_branch(law, stream("test", law, i), C)
        extra = list(range(C.spine_edges, C.nonroot_nodes_per_branch))
        assert b.depth[: C.spine_edges] == tuple(range(1, 9))
        # The spine leaf never gets children: it stays the depth-eight target.
        assert all(b.parent[v] != C.spine_edges - 1 for v in extra)
        assert all(b.depth[b.parent[v]] < 8 for v in extra)
        if law == "spine_fan":
            assert {b.parent[v] for v in extra} <= set(range(0, 7))  # spine depths one through seven


def test_clustered_law_concentrates_on_three_hubs():
    # Half the additional nodes (12 of 24 on average) go to the three hubs, so the three most
    # used parents take far more than under the recursive law.
    clustered, recursive = _top_three_share("clustered"), _top_three_share("recursive")
    assert clustered >= 12 and clustered > recursive + 3


def test_balanced_four_cycles(worlds):
    for ws in worlds.values():
        for factor in ("target_root", "target_branch", "root_declaration_position",
                       *(f"key_position:{t}" for t in TASKS), *(f"lexical_rank:{t}" for t in TASKS)):
            values = [w.factors[factor] for w in ws]
            assert Counter(values) == {0: 32, 1: 32, 2: 32, 3: 32}
            assert all(sorted(values[i:i + 4]) == [0, 1, 2, 3] for i in range(0, 128, 4))
        for w in ws:
            assert w.root_declaration[w.factors["root_declaration_position"]] == w.tasks["root"].gold
            for t in TASKS:
                task = w.tasks[t]
                assert task.gold_index == w.factors[f"key_position:{t}"]
                names = sorted(w.names[v] for v in task.candidates)
                assert names.index(w.names[task.gold]) == w.factors[f"lexical_rank:{t}"]


def test_both_derangement_conditions(worlds):
    for ws in worlds.values():
        for w in ws:
            t = draw_treatments(w, SETTINGS)
            anchored = anchored_nodes(w)
            assert len(anchored) == 13 and set(w.forest.roots) <= anchored
            bins = mention_bins(w, anchored)
            eligible = {v for members in bins.values() if len(members) > 1 for v in members}
            assert set(t.eligible) == eligible
            unrestricted, constrained = t.maps["unrestricted"], t.maps["constrained"]
            assert sorted(unrestricted) == sorted(constrained) == list(range(516))  # bijections
            # Unrestricted: every eligible identifier moves, within the eligible set; the rest stay.
            assert {v for v in range(516) if unrestricted[v] != v} == eligible
            assert {unrestricted[v] for v in eligible} == eligible
            # Constrained: every identifier of every eligible bin moves, within its bin.
            assert {v for v in range(516) if constrained[v] != v} == eligible
            for members in bins.values():
                if len(members) > 1:
                    assert {constrained[v] for v in members} == set(members)
                else:
                    assert constrained[members[0]] == members[0] and unrestricted[members[0]] == members[0]
            assert t.maps["original"] == tuple(range(516))


def test_derangement_is_uniform_over_derangements():
    # Four items have nine derangements; rejection sampling must hit each about equally.
    rng = stream("test", "derangement")
    counts = Counter(tuple(derangement([0, 1, 2, 3], rng).values()) for _ in range(9000))
    assert len(counts) == 9 and all(v != k for d in counts for k, v in enumerate(d))
    assert max(counts.values()) - min(counts.values()) < 200
