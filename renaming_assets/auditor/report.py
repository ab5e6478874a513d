"""The audit: per-world proofs and invariant checks, the schedule audit, and ``audit.json``.

Protocol: the auditor "proves this using marked rooted-tree signatures"; "The audit
reports query-blind first/last-key and lexical-minimum/maximum baselines"; "the audit
reports collisions rather than treating topology uniqueness as a selection criterion";
"The audit exports within-body and cross-name pair-gap distributions, mean positions and
body identities."
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from fractions import Fraction

from renaming_assets.auditor.parse import AuditError, mentioned, parse_state, tokens
from renaming_assets.auditor.trees import build_graph, marked_forest_codes, oracle, topology_digest
from renaming_assets.settings import FAMILIES, LAYOUTS, NAMINGS, RENAMINGS, TASKS, Settings

#: How many failure messages audit.json lists (the count is always complete).
LISTED_FAILURES = 50


def _sha256_canonical(obj: object) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _positional_map(original, renamed, where: str, fail) -> dict[str, str]:
    """orig identifier -> renamed identifier at the same record roles; must be a bijection."""
    sigma: dict[str, str] = {r: r for r in original.roots}
    for (c0, p0), (c1, p1) in zip(original.records, renamed.records):
        for a, b in ((c0, c1), (p0, p1)):
            if sigma.setdefault(a, b) != b:
                fail(f"{where}: identifier {a!r} is written as both {sigma[a]!r} and {b!r} (not one bijection)")
    if len(set(sigma.values())) != len(sigma):
        fail(f"{where}: the positional map is not injective")
    return sigma


def _audit_treatment(world: str, naming: str, states: dict, rows: dict, names: set[str], anchored: set[str],
                     eligible: set[str], counts, fail) -> int:
    """Protocol, "Treatments": one map per treatment, moving exactly the eligible set and
    preserving question/candidate bytes, roots, abstract graph, record positions, state byte
    length; the constrained map also the inventory, role counts, word/punctuation multiset
    and character bag. Returns how many identifiers' role counts the map changes."""
    sigmas, changed = [], 0
    for layout in LAYOUTS:
        original, renamed = states[(layout, "original")], states[(layout, naming)]
        where = f"{world}:{layout}:{naming}"
        for task in TASKS:
            b0, b1 = rows[(layout, task, "original")]["body"], rows[(layout, task, naming)]["body"]
            if b0["instructions"] != b1["instructions"] or b0["alternatives"] != b1["alternatives"]:
                fail(f"{where}:{task}: question or candidate bytes differ from the original")
        if original.roots != renamed.roots or len(original.records) != len(renamed.records):
            fail(f"{where}: roots or record count differ from the original")
        if len(original.text.encode()) != len(renamed.text.encode()):
            fail(f"{where}: state byte length differs from the original")
        sigma = _positional_map(original, renamed, where, fail)
        sigmas.append(sigma)
        moved = {a for a, b in sigma.items() if a != b}
        if moved != eligible:
            fail(f"{where}: moves {len(moved)} identifiers, the eligible set has {len(eligible)}")
        if any(sigma.get(a, a) != a for a in anchored):
            fail(f"{where}: an anchored identifier moved")
        before, after = original.role_counts(), renamed.role_counts()
        changed = sum(1 for n in names if before[n] != after[n])
        if naming == "constrained":
            if any(counts[a] != counts[b] for a, b in sigma.items()):
                fail(f"{where}: an identifier moved across (child, parent) mention bins")
            if changed or set(before) != set(after):
                fail(f"{where}: name inventory or per-identifier role counts changed")
            if tokens(original.text) != tokens(renamed.text) or Counter(original.text) != Counter(renamed.text):
                fail(f"{where}: word/punctuation multiset or character bag changed")
    if sigmas[0] != sigmas[1]:
        fail(f"{world}:{naming}: the layouts use different maps (one preselected map per treatment)")
    return changed


def _audit_layouts(world: str, states: dict, graphs: dict, fail) -> None:
    """The root-grouped layout is the shuffled order grouped by declared root, keeping the
    shuffled relative order within each group."""
    for naming in NAMINGS:
        shuffled, grouped = states[("shuffled", naming)], states[("grouped", naming)]
        g = graphs[("shuffled", naming)]
        rank = {r: i for i, r in enumerate(shuffled.roots)}
        if list(grouped.records) != sorted(shuffled.records, key=lambda rec: rank[g.root_of(rec[0])]):
            fail(f"{world}:{naming}: grouped layout is not the shuffled order grouped by declared root")
        if grouped.roots != shuffled.roots:
            fail(f"{world}:{naming}: layouts declare roots differently")


def audit_world(world: str, rows: dict[tuple[str, str, str], dict], settings: Settings) -> dict:
    """Every property of one world's eighteen bodies (``rows`` keyed by layout, task, naming)."""
    failures: list[str] = []
    fail = failures.append
    c = settings.cohort
    states = {}
    for (layout, task, naming), row in sorted(rows.items()):
        body, where = row["body"], f"{world}:{layout}:{task}:{naming}"
        if _sha256_canonical(body) != row["body_sha256"]:
            fail(f"{where}: body_sha256 does not match the body")
        if body.get("model") != settings.request.model or body.get("type") != settings.request.answer_type:
            fail(f"{where}: request is not a {settings.request.answer_type} request pinned to {settings.request.model}")
        keys = [a["key"] for a in body["alternatives"]]
        if keys != list(c.keys) or row["expected"]["keys"] != list(c.keys) or row["expected"]["gold"] not in keys:
            fail(f"{where}: alternatives/expected keys are not {list(c.keys)} with a declared gold")
        if (layout, naming) not in states:
            states[(layout, naming)] = parse_state(body["state"], where)
        elif states[(layout, naming)].text != body["state"]:
            fail(f"{where}: state differs between tasks of one layout and naming")

    graphs = {key: build_graph(s.roots, s.records, f"{world}:{key[0]}:{key[1]}") for key, s in states.items()}
    base, graph = states[("shuffled", "original")], graphs[("shuffled", "original")]
    names = set(graph.nodes)
    if len(names) != c.nodes_per_world or len(graph.roots) != c.roots:
        fail(f"{world}: {len(names)} nodes and {len(graph.roots)} roots, expected {c.nodes_per_world} and {c.roots}")
    lengths = {len(n) for n in names}
    if len(lengths) != 1:
        fail(f"{world}: identifiers have lengths {sorted(lengths)}, expected one length")

    anchored: set[str] = set()
    orbit, baselines, descriptors = {}, {}, {}
    for task in TASKS:
        body = rows[("shuffled", task, "original")]["body"]
        targets = set(mentioned(body["instructions"], names))
        alternatives = [a["text"] for a in body["alternatives"]]
        anchored |= targets | set(alternatives)
        where = f"{world}:{task}"
        if len(targets) != 1 or len(set(alternatives)) != c.alternatives or not set(alternatives) <= names:
            fail(f"{where}: expected one target and {c.alternatives} distinct candidates in the graph")
            continue
        target = targets.pop()
        if graph.depth[target] != c.target_depth or graph.children[target]:
            fail(f"{where}: target {target!r} is not a depth-{c.target_depth} leaf")
        codes = marked_forest_codes(graph, alternatives)
        orbit[task] = len(set(codes)) == 1
        if not orbit[task]:
            fail(f"{where}: candidates are not one automorphism orbit (marked signatures differ)")
        descriptors[task] = sorted({(graph.depth[a], len(graph.children[a]), graph.subtree_size(a)) for a in alternatives})
        gold_key = rows[("shuffled", task, "original")]["expected"]["gold"]
        texts = dict(zip(c.keys, alternatives))
        baselines[task] = {
            "first_key": gold_key == c.keys[0], "last_key": gold_key == c.keys[-1],
            "lexical_min": texts[gold_key] == min(alternatives), "lexical_max": texts[gold_key] == max(alternatives),
        }
        for (layout, naming), g in graphs.items():
            answer = oracle(g, task, target, c.ancestor_distance)
            key = {t: k for k, t in texts.items()}.get(answer)
            if key != rows[(layout, task, naming)]["expected"]["gold"]:
                fail(f"{where}:{layout}:{naming}: exact answer {answer!r} (key {key}) is not the expected gold")
    if not set(graph.roots) <= anchored:
        fail(f"{world}: not every root is anchored")

    counts = base.role_counts()
    bins: dict[tuple[int, int], list[str]] = defaultdict(list)
    for n in sorted(names - anchored):
        bins[counts[n]].append(n)
    eligible = {n for members in bins.values() if len(members) > 1 for n in members}

    role_changes = {naming: _audit_treatment(world, naming, states, rows, names, anchored, eligible, counts, fail)
                    for naming in RENAMINGS}
    _audit_layouts(world, states, graphs, fail)

    return {
        "world": world, "failures": failures, "orbit": orbit, "baselines": baselines,
        "descriptors_equal": {t: len(d) == 1 for t, d in descriptors.items()},
        "anchored": len(anchored), "eligible": len(eligible), "nodes": len(names),
        "nonsingleton_bins": sum(1 for m in bins.values() if len(m) > 1),
        "fixed_singletons": sum(1 for m in bins.values() if len(m) == 1),
        "unrestricted_role_count_changes": role_changes.get("unrestricted"),
        "topology": topology_digest(graph),
    }


def _rate(values: list[bool]) -> float:
    return sum(values) / len(values) if values else None


def audit_family(family: str, rows: list[dict], settings: Settings) -> dict:
    """Audit one topology family's worlds from its planned rows (one copy per body)."""
    by_world: dict[str, dict] = defaultdict(dict)
    failures: list[str] = []
    for row in rows:
        key = (row["layout"], row["task"], row["naming"])
        seen = by_world[row["world"]].get(key)
        if seen is None:
            by_world[row["world"]][key] = row
        elif seen["body"] != row["body"] or seen["body_sha256"] != row["body_sha256"]:
            failures.append(f"{row['job']}: the two copies of a body differ")
    worlds = []
    for world in sorted(by_world):
        try:
            worlds.append(audit_world(world, by_world[world], settings))
        except (AuditError, ValueError, KeyError) as error:
            failures.append(f"{world}: unreadable: {error}")
    for w in worlds:
        failures.extend(w["failures"])
    expected = settings.cohort.worlds_per_family
    if len(worlds) != expected:
        failures.append(f"{family}: {len(worlds)} worlds, expected {expected}")
    return {
        "family": family,
        "worlds": len(worlds),
        "failures": failures,
        "nodes_per_world": sorted({w["nodes"] for w in worlds}),
        "orbit_proven": {t: sum(w["orbit"].get(t, False) for w in worlds) for t in TASKS},
        "candidate_descriptors_equal": {t: sum(w["descriptors_equal"].get(t, False) for w in worlds) for t in TASKS},
        "baselines": {t: {b: _rate([w["baselines"][t][b] for w in worlds if t in w["baselines"]])
                          for b in ("first_key", "last_key", "lexical_min", "lexical_max")} for t in TASKS},
        "anchored_identifiers": sorted({w["anchored"] for w in worlds}),
        "eligible_identifiers": {"min": min((w["eligible"] for w in worlds), default=0),
                                 "max": max((w["eligible"] for w in worlds), default=0),
                                 "mean": _rate([w["eligible"] for w in worlds])},
        "fixed_singleton_bins": sum(w["fixed_singletons"] for w in worlds),
        "unrestricted_role_count_changes_mean": _rate([w["unrestricted_role_count_changes"] for w in worlds]),
        "topologies": {w["world"]: w["topology"] for w in worlds},
    }


def _histogram(values: list[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


def audit_schedule(rows: list[dict], settings: Settings) -> dict:
    """Counts, body identities, block structure, mirrored pairs, mean positions and gaps."""
    failures: list[str] = []
    fail = failures.append
    c = settings.cohort
    copies = settings.schedule.copies
    six = [(n, k) for n in NAMINGS for k in copies]
    planned = c.worlds * len(LAYOUTS) * len(TASKS) * len(NAMINGS) * len(copies)
    jobs = [r["job"] for r in rows]
    if len(rows) != planned or len(set(jobs)) != len(jobs):
        fail(f"plan: {len(rows)} rows and {len(set(jobs))} distinct jobs, expected {planned} of each")
    if [r["dispatch_index"] for r in rows] != list(range(len(rows))):
        fail("plan: dispatch_index is not 0..N-1 in row order")

    body_rows: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        body_rows[r["metadata"]["body_id"]].append(r)
    bodies = {}
    for bid, rs in sorted(body_rows.items()):
        if sorted(r["copy"] for r in rs) != list(copies) or len({r["body_sha256"] for r in rs}) != 1:
            fail(f"{bid}: not scheduled exactly once per copy with one body hash")
        bodies[bid] = rs[0]["body_sha256"]
    if len(set(bodies.values())) != len(bodies):
        fail("plan: two body ids share one body hash (bodies are not distinct)")

    blocks: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    world_span: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        blocks[(r["world"], r["layout"], r["task"])].append(r)
        world_span[r["world"]].append(r["dispatch_index"])
    for world, idx in world_span.items():
        if max(idx) - min(idx) + 1 != len(idx):
            fail(f"{world}: the world's jobs are not one contiguous dispatch block")
    order: dict[tuple[str, str, str], list[tuple[str, int]]] = {}
    for key, rs in blocks.items():
        rs.sort(key=lambda r: r["dispatch_index"])
        if [r["block_position"] for r in rs] != list(range(len(six))) or \
                rs[-1]["dispatch_index"] - rs[0]["dispatch_index"] != len(six) - 1:
            fail(f"{':'.join(key)}: block positions are not 0..5 in one contiguous run")
        conds = [(r["naming"], r["copy"]) for r in rs]
        if sorted(conds) != sorted(six):
            fail(f"{':'.join(key)}: block is not a permutation of the six naming-by-copy conditions")
        order[key] = conds

    world_meta = {r["world"]: (r["family"], r["metadata"]["world_index"]) for r in rows}
    by_index = {(fam, i): w for w, (fam, i) in world_meta.items()}
    mirrored = 0
    for (world, layout, task), conds in order.items():
        family, i = world_meta[world]
        if i % 2 == 0:
            partner = by_index.get((family, i + 1))
            if partner is None or order.get((partner, layout, task)) != conds[::-1]:
                fail(f"{world}:{layout}:{task}: the next world index does not receive the reverse permutation")
            else:
                mirrored += 1

    sums: dict[tuple[str, str, str], dict[tuple[str, int], list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        sums[(r["family"], r["layout"], r["task"])][(r["naming"], r["copy"])].append(r["block_position"])
    mean_positions = {}
    target = Fraction(settings.schedule.mean_block_position)
    for stratum, per in sorted(sums.items()):
        means = {f"{n}:copy{k}": Fraction(sum(v), len(v)) for (n, k), v in sorted(per.items())}
        for cond, m in means.items():
            if m != target:
                fail(f"{':'.join(stratum)}: {cond} has mean block position {m}, expected {target}")
        mean_positions[":".join(stratum)] = {k: float(m) for k, m in means.items()}

    within, cross = [], {n: [] for n in RENAMINGS}
    for key, rs in blocks.items():
        pos = {(r["naming"], r["copy"]): r["block_position"] for r in rs}
        for naming in NAMINGS:
            if all((naming, k) in pos for k in copies):
                within.append(abs(pos[(naming, copies[0])] - pos[(naming, copies[1])]))
        for naming in RENAMINGS:
            cross[naming].extend(abs(pos[("original", i)] - pos[(naming, j)])
                                 for i in copies for j in copies if ("original", i) in pos and (naming, j) in pos)
    return {
        "failures": failures,
        "jobs": len(rows), "distinct_jobs": len(set(jobs)), "bodies": len(bodies),
        "distinct_body_hashes": len(set(bodies.values())),
        "blocks": len(blocks), "mirrored_pairs": mirrored,
        "mean_block_positions": mean_positions,
        "within_body_gaps": _histogram(within),
        "within_body_gap_mean": _rate(within),
        "adjacent_exact_copies": sum(1 for g in within if g == 1),
        "cross_name_gaps": {n: _histogram(v) for n, v in cross.items()},
        "cross_name_gap_means": {n: _rate(v) for n, v in cross.items()},
        "body_identities": bodies,
    }


def combine(family_audits: dict[str, dict], schedule: dict, settings: Settings) -> dict:
    """``audit.json``: one object, failures first, with every reported figure."""
    failures = [f for fam in FAMILIES for f in family_audits[fam]["failures"]] + schedule["failures"]
    topologies: dict[str, list[str]] = defaultdict(list)
    for fam in FAMILIES:
        for world, digest in family_audits[fam]["topologies"].items():
            topologies[digest].append(world)
    collisions = sorted(sorted(ws) for ws in topologies.values() if len(ws) > 1)
    families = {fam: {k: v for k, v in family_audits[fam].items() if k not in ("failures", "topologies")}
                for fam in FAMILIES}
    return {
        "study": settings.study,
        "passed": not failures,
        "failure_count": len(failures),
        "failures": failures[:LISTED_FAILURES],
        "counts": {
            "worlds": sum(f["worlds"] for f in families.values()),
            "nodes_per_world": sorted({n for f in families.values() for n in f["nodes_per_world"]}),
            "bodies": schedule["bodies"], "jobs": schedule["jobs"],
        },
        "families": families,
        "topology_collisions": {"distinct_topologies": len(topologies), "colliding_groups": collisions},
        "schedule": {k: v for k, v in schedule.items() if k not in ("failures", "body_identities")},
        "body_identities": schedule["body_identities"],
    }


def audit_plan(rows: list[dict], settings: Settings) -> dict:
    per_family: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        per_family[r["family"]].append(r)
    families = {fam: audit_family(fam, per_family[fam], settings) for fam in FAMILIES}
    return combine(families, audit_schedule(rows, settings), settings)
