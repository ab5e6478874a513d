"""Dagster wiring of the anchor-fixed renaming study (no science here: the standard-library
generator, auditor, precision plan, freeze and analyzer do the work).

Per-family work is partitioned by topology family; the bundle, the assembled audit, the
precision plan, the freeze and the analysis are single artifacts of the whole cohort.
(No ``from __future__ import annotations`` here: Dagster inspects the context annotation.)
"""

import json
from pathlib import Path

import dagster as dg

from renaming_assets import bundle as release
from renaming_assets import synthetic
from renaming_assets.analyze import analyze, dumps_result, endpoint_lines
from renaming_assets.auditor import audit_family, audit_schedule, combine
from renaming_assets.generator.plan import assemble_plan, family_plan
from renaming_assets.resources import PROJECT_ROOT, RenamingStudy
from renaming_assets.settings import FAMILIES

family_partitions = dg.StaticPartitionsDefinition(list(FAMILIES))
GROUP = "renaming"


@dg.asset(partitions_def=family_partitions, group_name=GROUP)
def renaming_family_bodies(context: dg.AssetExecutionContext, study: RenamingStudy) -> dict:
    """Protocol "Cohort and tasks" and "Treatments", one topology family: its independently
    seeded worlds and their 2 layouts x 3 tasks x 3 namings request bodies."""
    family = context.partition_key
    bodies = family_plan(family, study.settings())
    context.add_output_metadata({"bodies": len(bodies), "worlds": len({b["world"] for b in bodies.values()})})
    return bodies


@dg.asset(group_name=GROUP)
def renaming_bundle(context: dg.AssetExecutionContext, study: RenamingStudy,
                    renaming_family_bodies: dict[str, dict]) -> str:
    """Protocol "Scheduling": every body scheduled twice, in dispatch order (``plan.jsonl``)."""
    bodies = {bid: b for family in FAMILIES for bid, b in renaming_family_bodies[family].items()}
    rows = assemble_plan(bodies, study.settings())
    path = release.write_plan(study.bundle(), rows)
    context.add_output_metadata({"plan": str(path), "jobs": len(rows), "bodies": len(bodies),
                                 "plan_sha256": release.sha256_file(path)})
    return str(study.bundle())


def _family_rows(plan: Path, family: str) -> list[dict]:
    marker = f'"family":"{family}"'
    with open(plan, encoding="utf-8") as f:
        return [json.loads(line) for line in f if marker in line]


@dg.asset(partitions_def=family_partitions, group_name=GROUP, deps=[renaming_bundle])
def renaming_family_audit(context: dg.AssetExecutionContext, study: RenamingStudy) -> dict:
    """The independent auditor on one family: orbit proofs (marked rooted-tree signatures),
    treatment invariants, query-blind baselines, topologies."""
    family = context.partition_key
    audit = audit_family(family, _family_rows(study.bundle() / release.PLAN, family), study.settings())
    context.add_output_metadata({"failures": len(audit["failures"]), "worlds": audit["worlds"],
                                 **{f"orbit_proven_{t}": n for t, n in audit["orbit_proven"].items()}})
    return audit


@dg.asset(group_name=GROUP, deps=[renaming_bundle])
def renaming_audit(context: dg.AssetExecutionContext, study: RenamingStudy,
                   renaming_family_audit: dict[str, dict]) -> dict:
    """``audit.json``: the family audits plus the schedule audit (mean positions, gaps, body
    identities, topology collisions). Fails, leaving the bundle unfrozen, if any check fails."""
    settings = study.settings()
    rows = release.read_plan(study.bundle() / release.PLAN)
    audit = combine(renaming_family_audit, audit_schedule(rows, settings), settings)
    release.write_audit(study.bundle(), audit)
    context.add_output_metadata({"passed": audit["passed"], "failure_count": audit["failure_count"],
                                 "jobs": audit["counts"]["jobs"], "bodies": audit["counts"]["bodies"],
                                 "topology_collision_groups": len(audit["topology_collisions"]["colliding_groups"])})
    return {k: audit[k] for k in ("passed", "failure_count", "counts")}


@dg.asset(group_name=GROUP, deps=[renaming_bundle])
def renaming_precision(context: dg.AssetExecutionContext, study: RenamingStudy) -> str:
    """``precision.json``: normal-approximation planning and exact hypothetical moments."""
    path = release.write_precision(study.bundle(), study.settings())
    plan = json.loads(path.read_text())
    context.add_output_metadata({f"power_sd_{r['sd']}": r["power_at_smallest_effect"] for r in plan["by_world_sd"]})
    return str(path)


@dg.asset(group_name=GROUP, deps=[renaming_bundle, renaming_audit, renaming_precision])
def renaming_freeze(context: dg.AssetExecutionContext, study: RenamingStudy) -> dict:
    """``freeze.json``: SHA-256 of the frozen sources and of every artifact."""
    release.write_freeze(study.bundle(), study.settings())
    freeze = json.loads((study.bundle() / release.FREEZE).read_text())
    context.add_output_metadata({f"{name}_sha256": h for name, h in freeze["artifacts"].items()})
    return freeze


class AnalysisConfig(dg.Config):
    """Log paths (JSON lines) of the attempted jobs, and where to write result.json."""

    logs: list[str]
    out: str = "data/renaming/result.json"


@dg.asset(group_name=GROUP, deps=[renaming_freeze])
def renaming_analysis(context: dg.AssetExecutionContext, study: RenamingStudy, config: AnalysisConfig) -> dict:
    """The analyzer over the configured logs (protocol "Primary estimands and inference")."""
    result = analyze(study.bundle(), [Path(p) for p in config.logs], study.settings())
    out = Path(config.out)
    out = out if out.is_absolute() else PROJECT_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps_result(result), encoding="utf-8")
    context.add_output_metadata({"result": str(out), "evidence": result["evidence"],
                                 "endpoints": dg.MetadataValue.md("\n\n".join(endpoint_lines(result)))})
    return {"evidence": result["evidence"], "primary": result["primary"]}


@dg.asset(group_name="renaming_synthetic_demo", deps=[renaming_freeze])
def renaming_synthetic_log(context: dg.AssetExecutionContext, study: RenamingStudy) -> str:
    """SYNTHETIC responder (tests and demo only): one ``synthetic: true`` row per planned job.
    Not evidence; the analysis of it says so in its first line."""
    out = study.bundle().parent / "synthetic_log.jsonl"
    synthetic.write_synthetic_log(study.bundle() / release.PLAN, out, study.settings())
    context.add_output_metadata({"log": str(out), "synthetic": True})
    return str(out)
