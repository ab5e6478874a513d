"""Stage "reading" (Appendix B; Appendix C steps 5 and 7): the Stage 2 report and the data record.

Wiring only: the report, the deviations table and the record are built by the pure
functions in ``fear_assets.report``; this module gathers stored assets and the
provenance of each (asset key, partition, run id, data version) from the instance.
"""


import json
from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions, registered_partition_keys
from fear_assets.report.data_record import NULL_REASONS, RecordInputs, to_parquet_bytes
from fear_assets.report.data_record import data_record as join_record
from fear_assets.report.sections import family_sections, preamble_text, write_report
from fear_assets.report.stage2 import FamilyReport, Provenance, Section, hypotheses_table, render_html
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.defs.resources.store import SCHEMA, connect_store

#: The upstream assets this module reads, in ONE place: the asset layer's names may change
#: (issue 12: pilot/confirmatory trial tables and scores); remap them here only.
UPSTREAM = {
    "registration_record": "registration_record", "posteriors": "posteriors", "reading": "section8_reading",
    "pilot_controls": "pilot_controls", "probe_controls": "probe_controls", "probe_outputs": "probe_outputs",
    "model_manifest": "model_manifest", "accounting": "trial_accounting", "scores": "pilot_scores",
    "control_scores": "pilot_control_scores", "frame_bank": "frame_bank", "matched_frames": "matched_frames",
    "binding_results": "binding_results", "surprisal": "sentence_surprisal", "trial_table": "pilot_trial_table",
    "report_scoring": "report_scoring", "cross_family": "cross_family_statement",
    "confirmatory_scores": "confirmatory_scores", "confirmatory_trial_table": "confirmatory_trial_table",
}
#: Inputs read per family (all of the family's depth partitions for family x depth assets).
PER_DEPTH = {"scores", "control_scores", "trial_table", "confirmatory_scores", "confirmatory_trial_table"}


def _ins(*names: str, all_partitions: bool = False) -> dict[str, dg.AssetIn]:
    def one(name):
        if all_partitions:
            return dg.AssetIn(key=UPSTREAM[name], partition_mapping=dg.AllPartitionMapping())
        if name in PER_DEPTH:
            return dg.AssetIn(key=UPSTREAM[name], partition_mapping=all_depths_of_family)
        return dg.AssetIn(key=UPSTREAM[name])
    return {name: one(name) for name in names}


def provenance(instance: dg.DagsterInstance, name: str, partitions: list[str | None]) -> list[Provenance]:
    """The latest stored materialisation of ``UPSTREAM[name]`` for each partition."""
    out = []
    key = dg.AssetKey(UPSTREAM[name])
    for partition in partitions:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1).records
        if not records:
            continue
        r = records[0]
        tags = r.asset_materialization.tags or {}
        out.append(Provenance(UPSTREAM[name], partition, r.run_id, tags.get("dagster/data_version"), r.timestamp))
    return out


def _depth_partitions(settings, family_key: str) -> list[str]:
    return [str(k) for k in registered_partition_keys(settings, family_key)]


def _stored(context, name: str, family_key: str) -> pd.DataFrame | None:
    """The stored rows of ``UPSTREAM[name]`` for one family, read through the store the IO
    manager writes (DuckDB file or Parquet tree); None where the asset is not materialised."""
    io = context.resources.io_manager
    # The DbIOManager keeps its store location privately: the DuckDB path, or the Parquet root.
    root = getattr(getattr(io, "_db_client", None), "root", None)
    if not root and not Path(str(getattr(io, "_database", ""))).is_file():
        return None  # nothing stored yet
    with connect_store(store="parquet" if root else "duckdb", path=getattr(io, "_database", None), root=root) as con:
        exists = con.execute("select count(*) from information_schema.tables where table_schema = ? and "
                             "table_name = ?", [SCHEMA, UPSTREAM[name]]).fetchone()[0]
        if not exists:
            return None
        columns = {r[0] for r in con.execute("select column_name from information_schema.columns where "
                                             "table_schema = ? and table_name = ?", [SCHEMA, UPSTREAM[name]]).fetchall()}
        where = " where family = ?" if "family" in columns else ""
        return con.execute(f"select * from {SCHEMA}.{UPSTREAM[name]}{where}",
                           [family_key] if where else []).df()


FAMILY_INPUTS = ("registration_record", "posteriors", "reading", "pilot_controls", "probe_controls", "model_manifest",
                 "scores", "frame_bank", "matched_frames", "surprisal")


def _deps(names) -> list[dg.AssetDep]:
    return [dg.AssetDep(UPSTREAM[n], partition_mapping=all_depths_of_family) if n in PER_DEPTH
            else dg.AssetDep(UPSTREAM[n]) for n in names]


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "html"}, deps=_deps(FAMILY_INPUTS), required_resource_keys={"io_manager", "protocol"})
def stage2_report(context: dg.AssetExecutionContext) -> dg.Output[pd.DataFrame]:
    """The Stage 2 report of one family (Appendix C step 7: "Publish: Stage 2 report with all
    readings from Section 8 stated as they fall"): the registration record, every
    hypothesis with its 99% HDI and label (6.2), the gates, the controls, the reading with
    its qualifiers and flags, exclusions and the deviations from the registration, as one
    self-contained HTML file (and PDF where WeasyPrint is installed). Built only from
    stored assets; every table names its materialisation (asset, partition, run, data
    version); a part whose asset is not materialised yet says so."""
    protocol = context.resources.protocol
    settings = protocol.settings()
    family_key = context.partition_key
    depth_parts = _depth_partitions(settings, family_key)
    tables = {n: _stored(context, n, family_key) for n in FAMILY_INPUTS}
    sources = {n: provenance(context.instance, n, depth_parts if n in PER_DEPTH else
                             [None if n == "frame_bank" else family_key]) for n in FAMILY_INPUTS}
    sections, n_dev = family_sections(settings, family_key, tables, sources, UPSTREAM)
    document = render_html(f"Stage 2 report: {family_key}", preamble_text(settings),
                           [FamilyReport(family_key, sections)])
    row = write_report(Path(protocol.cache_dir).parent / "reports" / family_key, "stage2_report", document)
    reading = tables["reading"]["code"].iloc[0] if tables["reading"] is not None and len(tables["reading"]) \
        else "not materialised yet"
    table = pd.DataFrame([{"family": family_key, **row, "deviations": n_dev, "reading": reading}])
    return dg.Output(table, metadata={
        "report": dg.MetadataValue.path(row["html_path"]), "html_sha256": row["html_sha256"],
        "pdf": row["pdf_path"] or "not written (WeasyPrint not installed)", "deviations": n_dev,
        "reading": reading,
        "not materialised yet": ", ".join(UPSTREAM[n] for n, t in tables.items() if t is None) or "none"})


@dg.asset(kinds={"duckdb", "html"},
          ins={**_ins("reading", "posteriors", "cross_family", all_partitions=True),
               "stage2_report": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
def stage2_report_all(context: dg.AssetExecutionContext, protocol: ProtocolResource, reading: pd.DataFrame,
                      posteriors: pd.DataFrame, cross_family: pd.DataFrame,
                      stage2_report: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Stage 2 report across families (6.2: "each replication family is labelled
    separately ... a statement about current language models in general requires the same
    label on H2 in all three families"): every family's reading and labels side by side,
    the cross-family statement, and the path of each family's own report."""
    settings = protocol.settings()
    fams = sorted(set(reading["family"]))
    families = []
    for f in fams:
        src = lambda n: provenance(context.instance, n, [f])
        families.append(FamilyReport(f, [
            Section("Section 8 reading", "", reading[reading["family"] == f][["code", "row", "qualifiers", "flags"]],
                    src("reading")),
            Section("Hypotheses and gates", "", hypotheses_table(posteriors[posteriors["family"] == f]),
                    src("posteriors")),
            Section("Family report", "", stage2_report[stage2_report["family"] == f][["html_path", "html_sha256"]],
                    [p for p in [provenance(context.instance, "registration_record", [f])] for p in p]),
        ]))
    across = [Section("Cross-family statement", str(cross_family["statement"].iloc[0]), cross_family,
                      provenance(context.instance, "cross_family", [None]))]
    document = render_html("Stage 2 report: all families", preamble_text(settings), families, across)
    row = write_report(Path(protocol.cache_dir).parent / "reports", "stage2_report_all", document)
    return dg.Output(pd.DataFrame([{"families": ", ".join(fams), **row}]), metadata={
        "report": dg.MetadataValue.path(row["html_path"]), "families": ", ".join(fams)})


RECORD_INPUTS = ("scores", "control_scores", "trial_table", "surprisal", "report_scoring", "binding_results",
                 "probe_outputs", "model_manifest", "registration_record")
CONFIRMATORY_INPUTS = ("confirmatory_scores", "confirmatory_trial_table")


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "parquet"}, ins=_ins(*RECORD_INPUTS), deps=_deps(CONFIRMATORY_INPUTS),
          required_resource_keys={"io_manager", "protocol"})
def data_record(context: dg.AssetExecutionContext, **tables) -> dg.Output[pd.DataFrame]:
    """The data record of one family (Appendix B): one immutable record per trial, pilot and
    confirmatory, joined from the stored assets, in the registered collection order
    (Appendix C step 5: positive controls first, then all cells interleaved), with the time
    and run of the stored partition that holds it; exported as Parquet with its sha256.
    Masked condition codes only: the assignment log stays apart until unmasking. The
    confirmatory tables are read where stored (a design that scores no confirmatory block
    has none)."""
    protocol = context.resources.protocol
    settings = protocol.settings()
    family_key = context.partition_key
    parts = _depth_partitions(settings, family_key)
    scored_at = {}
    for name in ("scores", "control_scores", "confirmatory_scores"):
        for p in provenance(context.instance, name, parts):
            scored_at[(name, p.partition.split("|")[0] if "|" in p.partition else p.partition)] = (p.timestamp, p.run_id)
    confirmatory = {n: _stored(context, n, family_key) for n in CONFIRMATORY_INPUTS}
    trial_table = pd.concat([t for t in (tables["trial_table"], confirmatory["confirmatory_trial_table"])
                             if t is not None and len(t)], ignore_index=True)
    record = json.loads(tables["registration_record"]["record_json"].iloc[0])
    table = join_record(RecordInputs(tables["scores"], trial_table, tables["surprisal"], tables["report_scoring"],
                                     tables["binding_results"], tables["probe_outputs"], tables["model_manifest"],
                                     record, tables["control_scores"], scored_at,
                                     confirmatory["confirmatory_scores"]))
    data, digest = to_parquet_bytes(table)
    path = Path(protocol.cache_dir).parent / "records" / family_key / "data_record.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return dg.Output(table.assign(record_sha256=digest), metadata={
        "records": len(table), "parquet": dg.MetadataValue.path(str(path)), "parquet_sha256": digest,
        "null fields (why)": dg.MetadataValue.md(pd.DataFrame(
            [{"field": k, "why null": v} for k, v in NULL_REASONS.items()]).to_markdown(index=False)),
        "positive controls first": int(table["positive_control"].sum())})
