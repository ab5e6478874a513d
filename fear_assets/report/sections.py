"""The Stage 2 report's sections for one family (Appendix C step 7), built from the stored
tables the asset layer hands in and their provenance: pure, no store or instance access.
A section whose asset is not materialised yet says so; nothing is filled in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.estimands import estimand_records, estimand_view
from fear_assets.analysis.plots import diagnostic_plots, forest_plot
from fear_assets.analysis.steps import FITS_FILE, contrast_draws
from fear_assets.core.hashing import sha256_file
from fear_assets.lm.models import manifest_digest, registry
from fear_assets.models.data import analysed_rows
from fear_assets.registration.record import analysis_code_sha256
from fear_assets.core.registered import Registered
from fear_assets.reading.steps import LABELS as READING_LABELS, labels_table
from fear_assets.core.settings import DepthBand, ProtocolSettings
from fear_assets.report.stage2 import (FamilyReport, Provenance, Ran, Section, cite_all, deviations, hypotheses_table,
                                      html_to_pdf, plain, render_html)
from fear_assets.core.settings import depth_key


def ran_facts(settings, family_key: str, record: dict, posteriors, scores, frame_bank, model_manifest,
               matched_frames, surprisal, cite) -> tuple[dict, dict]:
    """(registered, ran) items for the deviations table; ``cite(name)`` names the source."""
    family = settings.family(family_key)
    sampler = settings.sampler
    registered = {
        "settings_sha256": record.get("settings_sha256"), "bank_sha256": record.get("bank_sha256"),
        "manifest_sha256": record.get("manifest_sha256"), "analysis_code_sha256": record.get("analysis_code_sha256"),
        "selected_names": record.get("selected_names"), "confirmatory frames": record.get("selected_frames"),
        "frames replaced": record.get("replacements") or {},
        "models": sorted(f"{role}: {spec.checkpoint}" for role, spec in registry(settings, family_key).items() if spec),
        "depths": list(family.depth_keys) if not family.reduced_design else "registered full design",
        "depth band": DepthBand.of(record.get("depth_band", [])).stored_keys,
        "H5 depth": depth_key(int(record["h5_depth"])) if record.get("h5_depth") is not None else None,
        "posterior draws per contrast (chains x draws)": sampler.chains * sampler.draws,
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


#: Why a materialised input can hold no rows (the report says so instead of "not materialised").
EMPTY_REASONS = {"probe_controls": "no confirmatory probe ran", "reading": "no reading stored",
                 "pilot_controls": "no positive control scored"}


def absent_text(family_key: str, tables: Mapping[str, pd.DataFrame | None], upstream: Mapping[str, str],
                names: Sequence[str]) -> str:
    """What is true of inputs a section cannot show: "not materialised yet" only for those with
    no stored materialisation; a materialised input with no rows says so and why."""
    parts = []
    unmaterialised = [upstream[n] for n in names if tables.get(n) is None]
    if unmaterialised:
        parts.append("not materialised yet: " + ", ".join(unmaterialised))
    for n in names:
        if tables.get(n) is not None and not len(tables[n]):
            reason = EMPTY_REASONS.get(n, "nothing stored for this family")
            parts.append(f"{upstream[n]} materialised, 0 rows: {reason}")
    return "; ".join(parts) + f" (family {family_key})"


def readable_json(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``table`` with its JSON-text ``columns`` (as some stored tables keep mappings) written
    as ``key: value`` pairs, never a JSON dump; other text is kept."""
    def one(value: object) -> object:
        try:
            parsed = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return value
        return plain(parsed) if isinstance(parsed, (dict, list)) else value
    return table.assign(**{c: [one(v) for v in table[c]] for c in columns if c in table.columns})


def readable_gates(gates: pd.DataFrame) -> pd.DataFrame:
    """The registration gates' rows with their numbers as ``key: value`` pairs (the record
    stores them as JSON)."""
    return readable_json(gates, ["numbers"])


def fits_table(posteriors: pd.DataFrame) -> pd.DataFrame | None:
    """Every fit's InferenceData file with its sha256 (the analysis' ``fits.csv``), and whether
    the file is there; None where the analysis wrote no list."""
    path = Path(str(posteriors["draws_file"].iloc[0])).parent / FITS_FILE if len(posteriors) else None
    if path is None or not path.is_file():
        return None
    fits = pd.read_csv(path, dtype=str)
    return fits.assign(present=[Path(f).is_file() for f in fits["file"]])


def family_sections(settings, family_key: str, tables: dict[str, pd.DataFrame | None],
                    sources: dict[str, list[Provenance]], upstream: Mapping[str, str], chains: int | None = None):
    """The report's sections for one family from whatever is stored: a section whose asset is
    not materialised yet says so, and one whose asset holds no rows says that (the report can
    be read at any stage; nothing is filled in). ``chains``: the fits' chains (the trace and
    rank plots split the stored draws by chain)."""
    cite = lambda name: cite_all(sources.get(name, []))
    have = lambda *names: all(tables.get(n) is not None and len(tables[n]) for n in names)
    missing = lambda heading, *names: Section(heading, absent_text(family_key, tables, upstream,
                                                                   [n for n in names if not have(n)]))
    chains = settings.sampler.chains if chains is None else chains
    sections, n_dev = [], 0
    # The scores the analysis read: the confirmatory ones, or the pilot's where the design
    # scored no confirmatory block (the reduced demo); exclusions and deviations follow them.
    pilot = tables.get("scores")
    scores, frame_set = analysed_rows(tables.get("confirmatory_scores") if have("confirmatory_scores")
                                      else pilot.iloc[:0] if pilot is not None else pd.DataFrame(),
                                      pilot if pilot is not None else pd.DataFrame())
    if frame_set == "confirmatory":
        tables = {**tables, "scores": scores}
        sources = {**sources, "scores": sources.get("confirmatory_scores", [])}
    record = json.loads(tables["registration_record"]["record_json"].iloc[0]) if have("registration_record") else None
    if record is not None:
        reg = pd.DataFrame([{"item": k, "value": plain(record[k])}
                            for k in ("protocol", "protocol_version", "status", "mode", "settings_sha256",
                                      "bank_sha256", "manifest_sha256", "analysis_code_sha256", "selected_names",
                                      "selected_frames", "depth_band", "h5_depth", "pilot_sigma", "pilot_sigma_judge",
                                      "supplementary_note_sha256", "reduced_design",
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
        if have("posteriors"):
            # The reading's labels beside their estimands' labels as read (the hypotheses table's
            # words), so a label the reading used from a non-converged fit is stated as such.
            sections.append(Section("Section 8 reading: its labels and the estimands", "",
                                    labels_table({k: reading[k] for k in READING_LABELS}, tables["posteriors"]),
                                    [*sources.get("reading", []), *sources.get("posteriors", [])]))
    else:
        sections.append(missing("Section 8 reading", "reading"))
    if have("posteriors"):
        post = tables["posteriors"]
        rows = post[post["kind"].isin(["confirmatory", "gate"]) & (post["status"] == "estimated")]
        forest = forest_plot(rows[["contrast", "mean", "hdi_low", "hdi_high", "label", "converged"]],
                             tuple(settings.decision.rope), settings.decision.hdi_prob,
                             f"{family_key}: H1-H5 and gates (99% HDI, ROPE shaded)") if len(rows) else None
        sections.append(Section("Hypotheses, gates and controls (6.2: 99% HDI, ROPE ±SESOI)",
                                "A label whose fit did not converge is stated as not to be read.",
                                hypotheses_table(post), sources.get("posteriors", []), image_png=forest,
                                image_alt="forest plot of H1-H5 and the gates"))
        sections.append(Section("Every estimand (6.2; 5)", "Every registered estimand with what its number is, its "
                                "label as read and its diagnostics; the same rows are written beside this report "
                                "as estimands.csv and estimands.json.", estimand_view(post),
                                sources.get("posteriors", [])))
        draws = contrast_draws(post)
        plots = diagnostic_plots(draws, chains)
        sections.append(Section(
            "Convergence diagnostics: trace and rank plots", "For every reported contrast with stored draws (ArviZ "
            "plot_trace and plot_rank; a mixed fit shows overlapping chains and flat rank histograms): "
            + (", ".join(plots) or "none stored") + ".", None, sources.get("posteriors", []),
            images=[img for name, (trace, rank) in plots.items()
                    for img in ((trace, f"trace plot of {name}"), (rank, f"rank plot of {name}"))]))
        fits = fits_table(post)
        sections.append(Section("Fits (InferenceData, netCDF)", "Every fit's posterior as saved by the analysis, with "
                                "its sha256 (open with arviz.from_netcdf).", fits, sources.get("posteriors", []))
                        if fits is not None else Section("Fits (InferenceData, netCDF)",
                                                         "no list of fits stored beside the draws (re-materialise "
                                                         f"posteriors) (family {family_key})"))
    else:
        sections.append(missing("Hypotheses, gates and controls", "posteriors"))
    if record is not None:
        sections.append(Section("Registration gates (pilot)", "",
                                readable_gates(tables["registration_record"][["gate", "passed", "numbers", "message"]]),
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
        sections.append(Section("Exclusions (4.8)", f"Trials flagged, by block, of the {frame_set} scores "
                                "(the rows the analysis read).", excl, sources.get("scores", [])))
    else:
        sections.append(missing("Exclusions (4.8)", "scores"))
    if have("accounting"):
        acc = tables["accounting"]
        sections.append(Section("Trial accounting (D2): every block", "Each block of the closed accounting with "
                                "its frames, expected and scored rows, and whether it closed.",
                                acc[[c for c in ACCOUNTING_SHOWN if c in acc.columns]], sources.get("accounting", [])))
    else:
        sections.append(missing("Trial accounting (D2)", "accounting"))
    needed = ("registration_record", "posteriors", "scores", "frame_bank", "model_manifest", "matched_frames",
              "surprisal")
    if have(*needed):
        registered, ran = ran_facts(settings, family_key, record, tables["posteriors"], tables["scores"],
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
    stored = pd.DataFrame([{"input": upstream[n], "rows": 0 if tables.get(n) is None else len(tables[n]),
                            "materialisation": cite(n)} for n in tables])
    sections.append(Section("Stored inputs of this report", "Every asset the report read, with its materialisation.",
                            stored, [p for n in tables for p in sources.get(n, [])]))
    return sections, n_dev


ESTIMANDS_CSV, ESTIMANDS_JSON = "estimands.csv", "estimands.json"
#: The trial accounting's columns the report shows (one row per block).
ACCOUNTING_SHOWN = ("block", "kind", "frames", "n_frames", "expected_rows", "actual_rows", "status")


def write_estimands(directory: Path, posteriors: pd.DataFrame | None) -> dict:
    """The estimands beside the HTML: ``estimands.csv`` (the report's rows as written) and
    ``estimands.json`` (the same rows and labels, with the raw numbers); paths and sha256s."""
    if posteriors is None or not len(posteriors):
        return {"estimands_csv": "", "estimands_json": ""}
    directory.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = directory / ESTIMANDS_CSV, directory / ESTIMANDS_JSON
    estimand_view(posteriors).to_csv(csv_path, index=False)
    json_path.write_text(json.dumps(estimand_records(posteriors), indent=1, ensure_ascii=False) + "\n",
                         encoding="utf-8")
    return {"estimands_csv": str(csv_path), "estimands_csv_sha256": sha256_file(csv_path),
            "estimands_json": str(json_path), "estimands_json_sha256": sha256_file(json_path)}


def write_report(directory: Path, name: str, document: str) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.html"
    path.write_text(document, encoding="utf-8")
    row = {"html_path": str(path), "html_sha256": sha256_file(path), "pdf_path": "", "pdf_sha256": ""}
    pdf = html_to_pdf(document)
    if pdf is not None:
        (directory / f"{name}.pdf").write_bytes(pdf)
        row.update(pdf_path=str(directory / f"{name}.pdf"), pdf_sha256=sha256_file(directory / f"{name}.pdf"))
    return row


def preamble_text(settings) -> str:
    return (f"Protocol {settings.protocol.name} ({settings.protocol.version}). "
            "Generated only from stored assets; each table's source line names the materialisation it came from "
            "(asset key [partition] · run id · data version). None of these readings is a verdict on consciousness "
            "(Section 8).")


@dataclass(frozen=True)
class WrittenReport:
    """A written Stage 2 report: its one-row table (paths, sha256s) and what its metadata shows."""

    table: pd.DataFrame
    html_path: str
    html_sha256: str
    pdf_path: str
    deviations: int
    reading: str
    #: The inputs not materialised yet (their asset names), in the inputs' order.
    missing: tuple[str, ...]
    #: The inputs materialised with no rows for this family (their asset names).
    empty: tuple[str, ...] = ()
    #: The estimands written beside the HTML (paths and sha256s; empty where no posteriors).
    estimands: Mapping[str, str] = field(default_factory=dict)


def family_report(view: Registered, tables: Mapping[str, pd.DataFrame | None],
                  sources: dict[str, list[Provenance]], upstream: Mapping[str, str],
                  directory: Path) -> WrittenReport:
    """The Stage 2 report of one family (Appendix C step 7: "Publish: Stage 2 report with all
    readings from Section 8 stated as they fall"), written under ``directory`` from whatever
    is stored; the reading is the stored one, or "not materialised yet"."""
    family_key = view.family.key
    sections, n_dev = family_sections(view.settings, family_key, dict(tables), sources, upstream,
                                      chains=view.sampler.chains)
    document = render_html(f"Stage 2 report: {family_key}", preamble_text(view.settings),
                           [FamilyReport(family_key, sections)])
    row = write_report(directory, "stage2_report", document)
    estimands = write_estimands(directory, tables.get("posteriors"))
    stored = tables["reading"]
    reading = stored["code"].iloc[0] if stored is not None and len(stored) else "not materialised yet"
    table = pd.DataFrame([{"family": family_key, **row, "deviations": n_dev, "reading": reading}])
    return WrittenReport(table, row["html_path"], row["html_sha256"], row["pdf_path"], n_dev, reading,
                         tuple(upstream[n] for n, t in tables.items() if t is None),
                         tuple(upstream[n] for n, t in tables.items() if t is not None and not len(t)), estimands)


def all_families_report(settings: ProtocolSettings, reading: pd.DataFrame, posteriors: pd.DataFrame,
                        cross_family: pd.DataFrame, stage2_report: pd.DataFrame,
                        provenance: Callable[[str, Sequence[str | None]], list[Provenance]],
                        directory: Path) -> WrittenReport:
    """The Stage 2 report across families (6.2: "each replication family is labelled
    separately ... a statement about current language models in general requires the same
    label on H2 in all three families"): every family's reading and labels side by side, the
    cross-family statement, and the path of each family's own report. ``provenance(name,
    partitions)`` names the stored materialisations a table came from."""
    fams = sorted(set(reading["family"]))
    families = []
    for f in fams:
        families.append(FamilyReport(f, [
            Section("Section 8 reading", "", reading[reading["family"] == f][["code", "row", "qualifiers", "flags"]],
                    provenance("reading", [f])),
            Section("Hypotheses and gates", "", hypotheses_table(posteriors[posteriors["family"] == f]),
                    provenance("posteriors", [f])),
            Section("Family report", "", stage2_report[stage2_report["family"] == f][["html_path", "html_sha256"]],
                    list(provenance("registration_record", [f]))),
        ]))
    across = [Section("Cross-family statement", str(cross_family["statement"].iloc[0]),
                      readable_json(cross_family, ["families", "descriptive_only"]), provenance("cross_family", [None]))]
    document = render_html("Stage 2 report: all families", preamble_text(settings), families, across)
    row = write_report(directory, "stage2_report_all", document)
    table = pd.DataFrame([{"families": ", ".join(fams), **row}])
    return WrittenReport(table, row["html_path"], row["html_sha256"], row["pdf_path"], 0, "", ())
