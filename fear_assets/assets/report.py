"""Stage "reading" (Appendix B; Appendix C steps 5 and 7): the Stage 2 report and the data record.

Wiring only: the report, the deviations table and the record are built by the pure
functions in ``fear_assets.report``; this module gathers stored assets and the
provenance of each (asset key, partition, run id, data version) from the instance.
"""


import json
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd

from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.report.stage2 import Provenance
from fear_assets.resources.protocol import ProtocolResource

GROUP = "reading"

#: The upstream assets this module reads, in ONE place: the asset layer's names may change
#: (issue 12: pilot/confirmatory trial tables and scores); remap them here only.
UPSTREAM = {
    "registration_record": "registration_record", "posteriors": "posteriors", "reading": "section8_reading",
    "pilot_controls": "pilot_controls", "probe_controls": "probe_controls", "probe_outputs": "probe_outputs",
    "model_manifest": "model_manifest", "accounting": "trial_accounting", "scores": "pilot_scores",
    "control_scores": "pilot_control_scores", "frame_bank": "frame_bank", "matched_frames": "matched_frames",
    "binding_results": "binding_results", "surprisal": "sentence_surprisal", "trial_table": "pilot_trial_table",
    "report_scoring": "report_scoring", "cross_family": "cross_family_statement",
}
#: Inputs read per family (all of the family's depth partitions for family x depth assets).
PER_DEPTH = {"scores", "control_scores", "trial_table"}


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
    from fear_assets.partitions import registered_partition_keys

    return [str(k) for k in registered_partition_keys(settings, family_key)]


def _ran_facts(settings, family_key: str, record: dict, posteriors, scores, frame_bank, model_manifest,
               matched_frames, surprisal, cite) -> tuple[dict, dict]:
    """(registered, ran) items for the deviations table; ``cite(name)`` names the source."""
    from fear_assets.lm.models import manifest_digest, registry
    from fear_assets.registration.record import analysis_code_sha256
    from fear_assets.report.stage2 import Ran

    family = settings.family(family_key)
    sampler = settings.section("sampler")
    registered = {
        "settings_sha256": record.get("settings_sha256"), "bank_sha256": record.get("bank_sha256"),
        "manifest_sha256": record.get("manifest_sha256"), "analysis_code_sha256": record.get("analysis_code_sha256"),
        "selected_names": record.get("selected_names"), "confirmatory frames": record.get("selected_frames"),
        "frames replaced": record.get("replacements") or {},
        "models": sorted(f"{role}: {spec.checkpoint}" for role, spec in registry(settings, family_key).items() if spec),
        "depths": list(family.depth_keys) if not family.reduced_design else "registered full design",
        "depth band": ",".join(f"d{d}" for d in record.get("depth_band", [])),
        "H5 depth": f"d{record.get('h5_depth')}",
        "posterior draws per contrast (chains x draws)": int(sampler["chains"]) * int(sampler["draws"]),
    }
    draws_file = Path(str(posteriors["draws_file"].iloc[0]))
    n_draws = None
    if draws_file.is_file():
        with np.load(draws_file) as z:
            n_draws = int(np.asarray(z[z.files[0]]).size) if z.files else None
    primary = scores[scores["block"] == "primary"]
    replaced = {r.replaces: r.item_id for r in matched_frames.itertuples() if getattr(r, "replaces", "")}
    ran = {
        "settings_sha256": Ran(sorted(set(scores["settings_sha256"])), cite("scores")),
        "bank_sha256": Ran(sorted(set(frame_bank["bank_sha256"])), cite("frame_bank")),
        "manifest_sha256": Ran(manifest_digest(model_manifest), cite("model_manifest")),
        "analysis_code_sha256": Ran(analysis_code_sha256(), "the analysis code that built this report"),
        "selected_names": Ran(json.loads(surprisal["selected_names"].iloc[0]) if len(surprisal) else None,
                              cite("surprisal")),
        "confirmatory frames": Ran(sorted(primary["item_id"].unique()) if len(primary) else
                                   "none scored (pilot frames only)", cite("scores")),
        "frames replaced": Ran(replaced, cite("matched_frames")),
        "models": Ran(sorted({f"{r.role}: {r.checkpoint}" for r in model_manifest.itertuples()
                              if r.checkpoint != "not available"}), cite("model_manifest")),
        "depths": Ran(sorted(scores["depth"].unique()) if not family.reduced_design else
                      f"reduced design {', '.join(sorted(scores['depth'].unique()))}: {family.reduced_design.reason}",
                      cite("scores")),
        "depth band": Ran(str(posteriors["band_depths"].iloc[0]), cite("posteriors")),
        "H5 depth": Ran(str(posteriors["h5_depth"].iloc[0]), cite("posteriors")),
        "posterior draws per contrast (chains x draws)": Ran(n_draws, f"{draws_file} (sha256 in posteriors)"),
    }
    if isinstance(registered["settings_sha256"], str):
        registered["settings_sha256"] = [registered["settings_sha256"]]
        registered["bank_sha256"] = [registered["bank_sha256"]]
    return registered, ran


def family_sections(settings, family_key: str, tables: dict[str, pd.DataFrame | None],
                    sources: dict[str, list[Provenance]]):
    """The report's sections for one family from whatever is stored: a section whose asset is
    not materialised yet says so (the report can be read at any stage; nothing is filled in)."""
    from fear_assets.analysis.plots import forest_plot
    from fear_assets.report.stage2 import Section, cite_all, deviations, hypotheses_table

    cite = lambda name: cite_all(sources.get(name, []))
    have = lambda *names: all(tables.get(n) is not None and len(tables[n]) for n in names)
    missing = lambda heading, *names: Section(heading, "not materialised yet: " + ", ".join(
        UPSTREAM[n] for n in names if not have(n)) + f" (family {family_key})")
    sections, n_dev = [], 0
    record = json.loads(tables["registration_record"]["record_json"].iloc[0]) if have("registration_record") else None
    if record is not None:
        reg = pd.DataFrame([{"item": k, "value": json.dumps(record[k]) if isinstance(record[k], (list, dict))
                             else record[k]}
                            for k in ("protocol", "protocol_version", "status", "mode", "settings_sha256",
                                      "bank_sha256", "manifest_sha256", "analysis_code_sha256", "selected_names",
                                      "selected_frames", "depth_band", "h5_depth", "pilot_sigma", "reduced_design",
                                      "stand_in") if k in record])
        sections.append(Section("Registration record",
                                f"Record file: {tables['registration_record']['record_path'].iloc[0]}", reg,
                                sources.get("registration_record", [])))
    else:
        sections.append(missing("Registration record", "registration_record"))
    if have("reading"):
        reading = tables["reading"].iloc[0]
        sections.append(Section(
            "Section 8 reading (stated as it fell)",
            f"Reading: {reading['code']} (decision table row {reading['row']}).\n"
            f"Qualifiers: {reading['qualifiers'] or 'none'}.\nFlags: {reading['flags'] or 'none'}.",
            tables["reading"][["code", "row", "h2", "h5", "gate_a", "gate_b", "gate_c", "descriptive_only"]],
            sources.get("reading", [])))
    else:
        sections.append(missing("Section 8 reading", "reading"))
    if have("posteriors"):
        post = tables["posteriors"]
        rows = post[post["kind"].isin(["confirmatory", "gate"]) & (post["status"] == "estimated")]
        forest = forest_plot(rows[["contrast", "mean", "hdi_low", "hdi_high", "label", "converged"]],
                             tuple(settings.decision["rope"]), settings.decision["hdi_prob"],
                             f"{family_key}: H1-H5 and gates (99% HDI, ROPE shaded)") if len(rows) else None
        sections.append(Section("Hypotheses, gates and controls (6.2: 99% HDI, ROPE ±SESOI)",
                                "A label whose fit did not converge is stated as not to be read.",
                                hypotheses_table(post), sources.get("posteriors", []), image_png=forest,
                                image_alt="forest plot of H1-H5 and the gates"))
    else:
        sections.append(missing("Hypotheses, gates and controls", "posteriors"))
    if record is not None:
        sections.append(Section("Registration gates (pilot)", "",
                                tables["registration_record"][["gate", "passed", "numbers", "message"]],
                                sources.get("registration_record", [])))
    for name, heading, cols in (
            ("pilot_controls", "Positive controls (4.6)", ["control", "mean", "hdi_low", "hdi_high", "passed", "reason"]),
            ("probe_controls", "Probe controls (6.1)", ["frame_set", "probe", "accuracy", "interval_low",
                                                        "interval_high", "excludes_chance"])):
        sections.append(Section(heading, "", tables[name][cols], sources.get(name, [])) if have(name)
                        else missing(heading, name))
    if have("scores"):
        s = tables["scores"]
        excl = s.groupby("block")[["excluded_context", "answer_exceeds_context", "generation_truncated"]] \
            .sum().astype(int).reset_index()
        sections.append(Section("Exclusions (4.8)", "Trials flagged, by block.", excl, sources.get("scores", [])))
    else:
        sections.append(missing("Exclusions (4.8)", "scores"))
    needed = ("registration_record", "posteriors", "scores", "frame_bank", "model_manifest", "matched_frames",
              "surprisal")
    if have(*needed):
        registered, ran = _ran_facts(settings, family_key, record, tables["posteriors"], tables["scores"],
                                     tables["frame_bank"], tables["model_manifest"], tables["matched_frames"],
                                     tables["surprisal"], cite)
        devs = deviations(registered, ran, record.get("deviations", []),
                          unordered=["confirmatory frames", "models", "settings_sha256", "bank_sha256"])
        n_dev = int(devs["deviates"].sum())
        sections.append(Section("Deviations from the registration", "Computed by comparing the registered record "
                                "with what ran; declared deviations are those the record lists.", devs,
                                [*sources.get("registration_record", []), *sources.get("scores", [])]))
    else:
        sections.append(missing("Deviations from the registration", *needed))
    stored = pd.DataFrame([{"input": UPSTREAM[n], "rows": 0 if tables.get(n) is None else len(tables[n]),
                            "materialisation": cite(n)} for n in tables])
    sections.append(Section("Stored inputs of this report", "Every asset the report read, with its materialisation.",
                            stored, [p for n in tables for p in sources.get(n, [])]))
    return sections, n_dev


def _write(directory: Path, name: str, document: str) -> dict:
    from fear_assets.hashing import sha256_file
    from fear_assets.report.stage2 import html_to_pdf

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.html"
    path.write_text(document, encoding="utf-8")
    row = {"html_path": str(path), "html_sha256": sha256_file(path), "pdf_path": "", "pdf_sha256": ""}
    pdf = html_to_pdf(document)
    if pdf is not None:
        (directory / f"{name}.pdf").write_bytes(pdf)
        row.update(pdf_path=str(directory / f"{name}.pdf"), pdf_sha256=sha256_file(directory / f"{name}.pdf"))
    return row


def _stored(context, name: str, family_key: str) -> pd.DataFrame | None:
    """The stored rows of ``UPSTREAM[name]`` for one family, read through the store the IO
    manager writes (DuckDB file or Parquet tree); None where the asset is not materialised."""
    from fear_assets.resources.store import SCHEMA, connect_store

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


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "html"}, deps=_deps(FAMILY_INPUTS), required_resource_keys={"io_manager", "protocol"})
def stage2_report(context: dg.AssetExecutionContext) -> dg.Output[pd.DataFrame]:
    """The Stage 2 report of one family (Appendix C step 7: "Publish: Stage 2 report with all
    readings from Section 8 stated as they fall"): the registration record, every
    hypothesis with its 99% HDI and label (6.2), the gates, the controls, the reading with
    its qualifiers and flags, exclusions and the deviations from the registration, as one
    self-contained HTML file (and PDF where WeasyPrint is installed). Built only from
    stored assets; every table names its materialisation (asset, partition, run, data
    version); a part whose asset is not materialised yet says so."""
    from fear_assets.report.stage2 import FamilyReport, render_html

    protocol = context.resources.protocol
    settings = protocol.settings()
    family_key = context.partition_key
    depth_parts = _depth_partitions(settings, family_key)
    tables = {n: _stored(context, n, family_key) for n in FAMILY_INPUTS}
    sources = {n: provenance(context.instance, n, depth_parts if n in PER_DEPTH else
                             [None if n == "frame_bank" else family_key]) for n in FAMILY_INPUTS}
    sections, n_dev = family_sections(settings, family_key, tables, sources)
    document = render_html(f"Stage 2 report: {family_key}", preamble_text(settings),
                           [FamilyReport(family_key, sections)])
    row = _write(Path(protocol.cache_dir).parent / "reports" / family_key, "stage2_report", document)
    reading = tables["reading"]["code"].iloc[0] if tables["reading"] is not None and len(tables["reading"]) \
        else "not materialised yet"
    table = pd.DataFrame([{"family": family_key, **row, "deviations": n_dev, "reading": reading}])
    return dg.Output(table, metadata={
        "report": dg.MetadataValue.path(row["html_path"]), "html_sha256": row["html_sha256"],
        "pdf": row["pdf_path"] or "not written (WeasyPrint not installed)", "deviations": n_dev,
        "reading": reading,
        "not materialised yet": ", ".join(UPSTREAM[n] for n, t in tables.items() if t is None) or "none"})


def preamble_text(settings) -> str:
    return (f"Protocol {settings.raw['protocol']['name']} ({settings.raw['protocol']['version']}). "
            "Generated only from stored assets; each table's source line names the materialisation it came from "
            "(asset key [partition] · run id · data version). None of these readings is a verdict on consciousness "
            "(Section 8).")


@dg.asset(group_name=GROUP, kinds={"duckdb", "html"},
          ins={**_ins("reading", "posteriors", "cross_family", all_partitions=True),
               "stage2_report": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
def stage2_report_all(context: dg.AssetExecutionContext, protocol: ProtocolResource, reading: pd.DataFrame,
                      posteriors: pd.DataFrame, cross_family: pd.DataFrame,
                      stage2_report: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Stage 2 report across families (6.2: "each replication family is labelled
    separately ... a statement about current language models in general requires the same
    label on H2 in all three families"): every family's reading and labels side by side,
    the cross-family statement, and the path of each family's own report."""
    from fear_assets.report.stage2 import FamilyReport, Section, hypotheses_table, render_html

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
    row = _write(Path(protocol.cache_dir).parent / "reports", "stage2_report_all", document)
    return dg.Output(pd.DataFrame([{"families": ", ".join(fams), **row}]), metadata={
        "report": dg.MetadataValue.path(row["html_path"]), "families": ", ".join(fams)})


RECORD_INPUTS = ("scores", "control_scores", "trial_table", "surprisal", "report_scoring", "binding_results",
                 "probe_outputs", "model_manifest", "registration_record")


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "parquet"}, ins=_ins(*RECORD_INPUTS))
def data_record(context: dg.AssetExecutionContext, protocol: ProtocolResource, **tables) -> dg.Output[pd.DataFrame]:
    """The data record of one family (Appendix B): one immutable record per trial, joined
    from the stored assets, in the registered collection order (Appendix C step 5:
    positive controls first, then all cells interleaved), with the time and run of the
    stored partition that holds it; exported as Parquet with its sha256. Masked condition
    codes only: the assignment log stays apart until unmasking."""
    from fear_assets.report.data_record import NULL_REASONS, RecordInputs, to_parquet_bytes
    from fear_assets.report.data_record import data_record as join

    settings = protocol.settings()
    family_key = context.partition_key
    parts = _depth_partitions(settings, family_key)
    scored_at = {}
    for name in ("scores", "control_scores"):
        for p in provenance(context.instance, name, parts):
            scored_at[(name, p.partition.split("|")[0] if "|" in p.partition else p.partition)] = (p.timestamp, p.run_id)
    record = json.loads(tables["registration_record"]["record_json"].iloc[0])
    table = join(RecordInputs(tables["scores"], tables["trial_table"], tables["surprisal"], tables["report_scoring"],
                              tables["binding_results"], tables["probe_outputs"], tables["model_manifest"], record,
                              tables["control_scores"], scored_at))
    data, digest = to_parquet_bytes(table)
    path = Path(protocol.cache_dir).parent / "records" / family_key / "data_record.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return dg.Output(table.assign(record_sha256=digest), metadata={
        "records": len(table), "parquet": dg.MetadataValue.path(str(path)), "parquet_sha256": digest,
        "null fields (why)": dg.MetadataValue.md(pd.DataFrame(
            [{"field": k, "why null": v} for k, v in NULL_REASONS.items()]).to_markdown(index=False)),
        "positive controls first": int(table["positive_control"].sum())})
