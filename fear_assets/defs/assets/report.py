"""Stage "reading" (Appendix B; Appendix C steps 5 and 7): the Stage 2 report and the data record.

Wiring only: the report, the deviations table and the record are built by the pure
functions in ``fear_assets.report``; this module gathers stored assets and the
provenance of each (asset key, partition, run id, data version) from the instance.
"""


import dagster as dg
import pandas as pd

from fear_assets.defs.metadata import partition_metadata
from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions, registered_partition_keys
from fear_assets.report.data_record import NULL_REASONS, write_data_record
from fear_assets.report.sections import all_families_report, family_report
from fear_assets.report.stage2 import Provenance
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.defs.resources.store import read_table

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
    """The stored rows of ``UPSTREAM[name]`` for one family (None where not materialised)."""
    return read_table(context.resources.io_manager, UPSTREAM[name], family_key)


FAMILY_INPUTS = ("registration_record", "posteriors", "reading", "pilot_controls", "probe_controls", "model_manifest",
                 "scores", "confirmatory_scores", "accounting", "frame_bank", "matched_frames", "surprisal")


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
    view = protocol.view(family_key)
    depth_parts = _depth_partitions(settings, family_key)
    tables = {n: _stored(context, n, family_key) for n in FAMILY_INPUTS}
    sources = {n: provenance(context.instance, n, depth_parts if n in PER_DEPTH else
                             [None if n == "frame_bank" else family_key]) for n in FAMILY_INPUTS}
    report = family_report(view, tables, sources, UPSTREAM, protocol.output_path("reports", family_key))
    estimands = report.estimands
    return dg.Output(report.table, metadata={
        **partition_metadata(context),
        "report": dg.MetadataValue.path(report.html_path), "html_sha256": report.html_sha256,
        "pdf": report.pdf_path or "not written (WeasyPrint not installed)", "deviations": report.deviations,
        "reading": report.reading, "not materialised yet": ", ".join(report.missing) or "none",
        "materialised, 0 rows": ", ".join(report.empty) or "none",
        "estimands (CSV)": dg.MetadataValue.path(estimands["estimands_csv"]) if estimands.get("estimands_csv")
        else "not written (posteriors not materialised yet)",
        "estimands (JSON)": dg.MetadataValue.path(estimands["estimands_json"]) if estimands.get("estimands_json")
        else "not written (posteriors not materialised yet)"})


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
    report = all_families_report(protocol.settings(), reading, posteriors, cross_family, stage2_report,
                                 lambda name, partitions: provenance(context.instance, name, partitions),
                                 protocol.output_path("reports"))
    families = report.table["families"].iloc[0]
    return dg.Output(report.table, metadata={
        "report": dg.MetadataValue.path(report.html_path), "families": families})


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
    family_key = context.partition_key
    parts = _depth_partitions(protocol.settings(), family_key)
    scored = {name: provenance(context.instance, name, parts)
              for name in ("scores", "control_scores", "confirmatory_scores")}
    confirmatory = {n: _stored(context, n, family_key) for n in CONFIRMATORY_INPUTS}
    record = write_data_record(tables, confirmatory, scored,
                               protocol.output_path("records", family_key, "data_record.parquet"))
    return dg.Output(record.table, metadata={
        **partition_metadata(context), "records": record.records, "parquet": dg.MetadataValue.path(record.path), "parquet_sha256": record.sha256,
        "null fields (why)": dg.MetadataValue.md(pd.DataFrame(
            [{"field": k, "why null": v} for k, v in NULL_REASONS.items()]).to_markdown(index=False)),
        "positive controls first": record.positive_controls})
