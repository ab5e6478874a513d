"""Per-world contrasts and the reported estimands (protocol, "Primary estimands and
inference", "Secondary", "Integrity, missingness and endpoint validity").

"Each naming contrast requires all four selected labels (two original, two named) in a
world. The constrained-versus-unrestricted secondary difference requires all six.
Probability distance requires all four complete vectors separately. Failure in an
unrelated treatment does not exclude a valid contrast." "An equal-family mean is undefined
if any family has no complete worlds." "report finite-cohort missing-outcome bounds using
the statistic's [-0.5,1] range."
"""

from __future__ import annotations

from collections import Counter, defaultdict

from renaming_assets.analyzer.statistics import (cross, equal_family_mean, excess, half_l1, holm, repeat,
                                                 sign_flip_p, stratified_bootstrap)
from renaming_assets.analyzer.validity import Outcome
from renaming_assets.settings import FAMILIES, LAYOUTS, NAMINGS, RENAMINGS, TASKS, Settings, stream

Cell = tuple[str, str, str]  # (world, layout, task)


def _by_cell(plan: dict[str, dict], outcomes: dict[str, Outcome]) -> dict[Cell, dict[tuple[str, int], Outcome]]:
    cells: dict[Cell, dict[tuple[str, int], Outcome]] = defaultdict(dict)
    for job, row in plan.items():
        cells[(row["world"], row["layout"], row["task"])][(row["naming"], row["copy"])] = outcomes[job]
    return cells


def _family_values(per_world: dict[str, float], families: dict[str, str]) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {f: [] for f in FAMILIES}
    for world in sorted(per_world):
        values[families[world]].append(per_world[world])
    return values


def _summary(per_world: dict[str, float], excluded: dict[str, list[str]], families: dict[str, str],
             planned_worlds: dict[str, int], settings: Settings, seed_key: tuple[str, ...] | None,
             bounds_range: tuple[float, float] | None) -> dict:
    values = _family_values(per_world, families)
    out = {
        "estimate": equal_family_mean(values),
        "family_means": {f: (sum(v) / len(v) if v else None) for f, v in values.items()},
        "complete_worlds": {f: len(v) for f, v in values.items()},
        "excluded_worlds": {w: jobs for w, jobs in sorted(excluded.items())},
    }
    if seed_key is not None:
        inf = settings.inference
        interval = stratified_bootstrap(values, inf.bootstrap_draws, inf.interval_level,
                                        stream(settings.seeds.study, "bootstrap", *seed_key))
        out["interval_95"] = list(interval) if interval else None
    if bounds_range is not None:
        low, high = bounds_range
        bounds = []
        for fill in (low, high):
            per = {f: sum(v) + fill * (planned_worlds[f] - len(v)) for f, v in values.items()}
            bounds.append(sum(per[f] / planned_worlds[f] for f in FAMILIES) / len(FAMILIES))
        out["missing_outcome_bounds"] = bounds
    return out


def analyze_outcomes(plan: dict[str, dict], outcomes: dict[str, Outcome], settings: Settings) -> dict:
    inf = settings.inference
    cells = _by_cell(plan, outcomes)
    families = {row["world"]: row["family"] for row in plan.values()}
    planned_worlds = Counter(families.values())
    copies = settings.schedule.copies

    contrasts: dict[str, dict] = {}
    for naming in RENAMINGS:
        for layout in LAYOUTS:
            for task in TASKS:
                stats = {k: {} for k in ("excess", "cross", "repeat", "accuracy_change", "repair", "harm",
                                         "half_l1_cross", "half_l1_repeat")}
                excluded, excluded_vectors = {}, {}
                for world in sorted(families):
                    cell = cells[(world, layout, task)]
                    a = [cell[("original", k)] for k in copies]
                    b = [cell[(naming, k)] for k in copies]
                    invalid = [o.job for o in a + b if o.label is None]
                    if invalid:
                        excluded[world] = invalid
                    else:
                        labels = [o.label for o in a + b]
                        gold = a[0].gold
                        stats["excess"][world] = excess(*labels)
                        stats["cross"][world] = cross(*labels)
                        stats["repeat"][world] = repeat(*labels)
                        stats["accuracy_change"][world] = (sum(o.label == gold for o in b) -
                                                           sum(o.label == gold for o in a)) / len(copies)
                        pairs = [(x, y) for x in a for y in b]
                        stats["repair"][world] = sum(x.label != gold and y.label == gold for x, y in pairs) / len(pairs)
                        stats["harm"][world] = sum(x.label == gold and y.label != gold for x, y in pairs) / len(pairs)
                    incomplete = [o.job for o in a + b if o.vector is None]
                    if incomplete:
                        excluded_vectors[world] = incomplete
                    else:
                        stats["half_l1_cross"][world] = sum(half_l1(x.vector, y.vector) for x in a for y in b) / 4
                        stats["half_l1_repeat"][world] = (half_l1(a[0].vector, a[1].vector) +
                                                          half_l1(b[0].vector, b[1].vector)) / 2
                name = f"{naming}:{layout}:{task}"
                entry = {"excess": _summary(stats["excess"], excluded, families, planned_worlds, settings,
                                            ("excess", naming, layout, task), inf.excess_range)}
                for k in ("cross", "repeat", "accuracy_change", "repair", "harm"):
                    entry[k] = _summary(stats[k], excluded, families, planned_worlds, settings, None, None)
                for k in ("half_l1_cross", "half_l1_repeat"):
                    entry[k] = _summary(stats[k], excluded_vectors, families, planned_worlds, settings, None, None)
                entry["per_world_excess"] = stats["excess"]
                contrasts[name] = entry

    differences = {}
    for layout in LAYOUTS:
        for task in TASKS:
            per_world, excluded = {}, {}
            for world in sorted(families):
                cell = cells[(world, layout, task)]
                six = [cell[(n, k)] for n in NAMINGS for k in copies]
                invalid = [o.job for o in six if o.label is None]
                if invalid:
                    excluded[world] = invalid
                    continue
                labels = {(n, k): cell[(n, k)].label for n in NAMINGS for k in copies}
                a = [labels[("original", k)] for k in copies]
                per_world[world] = (excess(*a, *[labels[("constrained", k)] for k in copies]) -
                                    excess(*a, *[labels[("unrestricted", k)] for k in copies]))
            differences[f"{layout}:{task}"] = _summary(per_world, excluded, families, planned_worlds, settings,
                                                       ("difference", layout, task), None)

    endpoints = []
    for naming, layout, task in inf.primary:
        name = f"{naming}:{layout}:{task}"
        summary = dict(contrasts[name]["excess"])
        values = _family_values(contrasts[name]["per_world_excess"], families)
        summary["p_sign_flip"] = sign_flip_p(values, inf.sign_flip_draws,
                                             stream(settings.seeds.study, "sign_flip", naming, layout, task),
                                             inf.numerical_tolerance)
        endpoints.append({"endpoint": name, "naming": naming, "layout": layout, "task": task, **summary})
    adjusted = holm({e["endpoint"]: e["p_sign_flip"] for e in endpoints}, inf.family_size)
    for e in endpoints:
        e["p_holm"] = adjusted[e["endpoint"]]
        e["available"] = e["estimate"] is not None
        e["interval_wholly_above_smallest_effect"] = bool(e["interval_95"]) and e["interval_95"][0] > inf.smallest_effect

    primary_names = {e["endpoint"] for e in endpoints}
    secondary = {name: {k: v for k, v in entry.items() if k != "per_world_excess"}
                 for name, entry in contrasts.items()}
    for name in primary_names:
        secondary[name]["note"] = "primary endpoint (see primary); secondary figures carry no p-values"
    return {
        "primary": {"family_size": inf.family_size, "smallest_effect": inf.smallest_effect,
                    "endpoints": endpoints},
        "secondary": {"contrasts": secondary, "constrained_minus_unrestricted_excess": differences},
        "available_calls": available_calls(plan, outcomes),
    }


def available_calls(plan: dict[str, dict], outcomes: dict[str, Outcome]) -> dict:
    """Available-call denominators and summaries, distinct from complete-world estimates."""
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for job, row in plan.items():
        groups[f"{row['naming']}:{row['layout']}:{row['task']}"].append(outcomes[job])
    out = {}
    for name, os_ in sorted(groups.items()):
        valid = [o for o in os_ if o.label is not None]
        vectors = [o for o in os_ if o.vector is not None]
        out[name] = {
            "planned_calls": len(os_), "valid_labels": len(valid),
            "accuracy_among_valid": (sum(o.label == o.gold for o in valid) / len(valid)) if valid else None,
            "complete_vectors": len(vectors),
            "mean_gold_probability_among_complete": (sum(o.vector[o.keys.index(o.gold)] for o in vectors)
                                                     / len(vectors)) if vectors else None,
            "failure_categories": dict(sorted(Counter(o.failure for o in os_ if o.failure).items())),
        }
    return out
