"""The independent auditor: orbit proofs on every world, and that it catches violations."""

import copy

from renaming_assets.auditor.report import audit_family, audit_world
from renaming_assets.auditor.trees import build_graph, marked_forest_codes
from renaming_assets.settings import FAMILIES, TASKS

from renaming_assets_tests.conftest import SMALL


def test_orbit_proof_on_every_world(full_audit):
    for family in FAMILIES:
        fam = full_audit["families"][family]
        assert fam["worlds"] == 128
        assert fam["orbit_proven"] == {t: 128 for t in TASKS}
        assert fam["candidate_descriptors_equal"] == {t: 128 for t in TASKS}
        assert fam["nodes_per_world"] == [516]
        for task in TASKS:  # query-blind baselines are exactly at chance by balance
            assert fam["baselines"][task] == {"first_key": 0.25, "last_key": 0.25, "lexical_min": 0.25,
                                              "lexical_max": 0.25}
    assert "colliding_groups" in full_audit["topology_collisions"]
    assert full_audit["body_identities"] and len(full_audit["body_identities"]) == 6_912


def test_marked_signatures_separate_non_orbits():
    # Two isomorphic trees under r1, r2, but a and b sit at different depths: not one orbit.
    records = (("x1", "r1"), ("a", "x1"), ("x2", "r2"), ("b", "x2"), ("y", "x2"))
    g = build_graph(("r1", "r2"), records, "test")
    codes = marked_forest_codes(g, ["a", "b", "x1", "x2"])
    assert codes[0] != codes[1] and codes[2] != codes[3]
    symmetric = build_graph(("r1", "r2"), (("x1", "r1"), ("a", "x1"), ("x2", "r2"), ("b", "x2")), "test")
    assert len(set(marked_forest_codes(symmetric, ["a", "b"]))) == 1
    assert len(set(marked_forest_codes(symmetric, ["r1", "r2"]))) == 1


def _world_rows(plan, world):
    return {(r["layout"], r["task"], r["naming"]): r for r in plan if r["world"] == world and r["copy"] == 1}


def _failures(world, rows):
    try:
        return audit_world(world, rows, SMALL)["failures"]
    except ValueError as error:  # an unreadable body is reported by audit_family as a failure
        return [str(error)]


def test_auditor_catches_a_broken_orbit_a_fixed_identifier_and_a_changed_question(small_plan):
    world = small_plan[0]["world"]
    rows = copy.deepcopy(_world_rows(small_plan, world))
    assert audit_world(world, rows, SMALL)["failures"] == []

    # Rename one candidate in the question's alternatives: question bytes change.
    bad = copy.deepcopy(rows)
    bad[("shuffled", "root", "constrained")]["body"]["instructions"] += " "
    assert any("question or candidate bytes" in f for f in _failures(world, bad))

    # Undo the constrained map on one record pair: the positional map is no longer a bijection
    # (or an eligible identifier stays fixed).
    bad = copy.deepcopy(rows)
    for layout in ("shuffled", "grouped"):
        orig_state = bad[(layout, "root", "original")]["body"]["state"].split("\n")
        for task in TASKS:
            body = bad[(layout, task, "constrained")]["body"]
            lines = body["state"].split("\n")
            lines[3] = orig_state[3]
            body["state"] = "\n".join(lines)
    failures = _failures(world, bad)
    assert any("bijection" in f or "two parent records" in f for f in failures), failures

    # A "constrained" treatment that moves nothing fails the derangement condition.
    bad = copy.deepcopy(rows)
    for layout in ("shuffled", "grouped"):
        for task in TASKS:
            bad[(layout, task, "constrained")]["body"]["state"] = bad[(layout, task, "original")]["body"]["state"]
    assert any("moves 0 identifiers" in f for f in _failures(world, bad))

    # Hang one extra node under a candidate root's first branch: candidates leave one orbit.
    fam = [r for r in small_plan if r["family"] == small_plan[0]["family"]]
    bad_rows = copy.deepcopy(fam)
    for r in bad_rows:
        if r["world"] == world:
            lines = r["body"]["state"].split("\n")
            # re-parent the node of the first record to a root: breaks the cloned symmetry
            child, _ = lines[2].split(" -> ")
            lines[2] = f"{child} -> {r['body']['state'].split(chr(10))[1][7:11]}"
            r["body"]["state"] = "\n".join(lines)
    audit = audit_family(small_plan[0]["family"], bad_rows, SMALL)
    assert audit["failures"]
    assert any("orbit" in f or "exact answer" in f or "depth" in f or "forest" in f or "unreadable" in f
               for f in audit["failures"])


def test_direct_target_parent_sentence_is_identical_across_namings(small_plan):
    for world in sorted({r["world"] for r in small_plan}):
        rows = _world_rows(small_plan, world)
        for layout in ("shuffled", "grouped"):
            body = rows[(layout, "parent", "original")]["body"]
            target = body["instructions"].split()[-1].rstrip("?")
            lines = {n: rows[(layout, "parent", n)]["body"]["state"].split("\n") for n in ("original", "unrestricted",
                                                                                             "constrained")}
            at = [i for i, line in enumerate(lines["original"]) if line.startswith(f"{target} -> ")]
            assert len(at) == 1
            assert lines["unrestricted"][at[0]] == lines["constrained"][at[0]] == lines["original"][at[0]]
            gold = dict((a["key"], a["text"]) for a in body["alternatives"])[rows[(layout, "parent", "original")]
                                                                            ["expected"]["gold"]]
            assert lines["original"][at[0]] == f"{target} -> {gold}"
