"""The Stage 2 report as a researcher reads it (Appendix C step 7; 6.1, 6.2): no section says
"not materialised" of an input the stored-inputs table lists as materialised; long hashes wrap;
ArviZ trace and rank plots for every contrast with stored draws; the estimands written as CSV
and JSON beside the HTML with the HTML table's rows; no Python or JSON reprs in its tables."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd

from fear_assets.analysis.estimands import NOT_CONVERGED_TEXT
from fear_assets.analysis.plots import PNG_MAGIC
from fear_assets.defs.assets.report import FAMILY_INPUTS, UPSTREAM
from fear_assets.report.sections import ESTIMANDS_CSV, ESTIMANDS_JSON, family_sections, write_estimands
from fear_assets.report.stage2 import FamilyReport, Section, render_html

FAMILY = "smollm2-135m"
HASH = "ae23b45b17f7c41d63490a84bf8417ea4fa0f40a362a9ce5a0510903d4ad480f"
REPRS = re.compile(r"\b(True|False|nan|None|NaN)\b|[{}]")


class _Tables(HTMLParser):
    """Every table of an HTML document after its heading, as lists of rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self.heading, self._cell, self._in_heading = {}, "", None, False

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3"):
            self._in_heading, self.heading = True, ""
        elif tag == "table":
            self.tables[self.heading] = []
        elif tag == "tr":
            self.tables[self.heading].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self._in_heading = False
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[self.heading][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._in_heading:
            self.heading += data
        elif self._cell is not None:
            self._cell += data


def _tables(document: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(document)
    return parser.tables


def _posteriors(tmp_path) -> pd.DataFrame:
    """H2 converged, H3 not (3 divergences), H4 not (its own fit), gate (a) not scored; draws
    stored for H2, H3 and H5 (2 chains x 100), H4's contrast draws beside its fit."""
    rng = np.random.default_rng(3)
    draws = tmp_path / "posteriors" / "contrasts.npz"
    draws.parent.mkdir(parents=True)
    np.savez(draws, **{name: rng.normal(0.1, 0.3, 200) for name in ("H2", "H3", "H5")})
    h4_fit = draws.parent / "h4_pilot.nc"
    h4_fit.write_bytes(b"")
    np.savez(draws.parent / "h4_pilot_contrast.npz", H4=rng.normal(0.8, 0.1, 200))
    pd.DataFrame([{"fit": "H4 (pilot)", "file": str(h4_fit), "sha256": "x"}]).to_csv(draws.parent / "fits.csv",
                                                                                        index=False)
    rows = [("H2", "confirmatory", "estimated", 0.1, -0.3, 0.5, "unresolved", ""),
            ("H3", "confirmatory", "estimated", 0.4, 0.2, 0.6, "supported", "3 divergences"),
            ("H5", "confirmatory", "estimated", 0.0, -0.4, 0.4, "unresolved", ""),
            ("H4", "confirmatory", "estimated", 0.8, 0.6, 1.0, "estimation_only", "see h4_posterior"),
            ("gate_a_service_relevance_H2", "gate", "not_scored", np.nan, np.nan, np.nan, "", ""),
            ("exclusions", "secondary", "descriptive", 1 / 3, np.nan, np.nan, "", "")]
    table = pd.DataFrame(rows, columns=["contrast", "kind", "status", "mean", "hdi_low", "hdi_high", "label",
                                        "convergence_problems"])
    return table.assign(converged=table["convergence_problems"] == "", rhat=1.004, ess_bulk=492.036,
                        ess_tail=401.2, divergences=0, note="", draws_file=str(draws), family=FAMILY)


def _tables_in(tmp_path, **given) -> dict:
    tables = {name: None for name in FAMILY_INPUTS}
    tables.update(given)
    return tables


def _document(settings, tables) -> str:
    sections, _ = family_sections(settings, FAMILY, tables, {}, UPSTREAM, chains=2)
    return render_html(f"Stage 2 report: {FAMILY}", "", [FamilyReport(FAMILY, sections)])


def test_an_input_materialised_with_no_rows_is_not_called_not_materialised(settings, tmp_path):
    probe = pd.DataFrame(columns=["family", "frame_set", "probe", "accuracy", "interval_low", "interval_high",
                                  "excludes_chance"])
    document = _document(settings, _tables_in(tmp_path, probe_controls=probe))
    text = re.sub(r"<[^>]+>", " ", document)
    assert "probe_controls materialised, 0 rows: no confirmatory probe ran" in text
    assert "not materialised yet: probe_controls" not in text
    stored = {row[0]: row[1] for row in _tables(document)["Stored inputs of this report"][1:]}
    assert stored["probe_controls"] == "0"
    # An input with no stored materialisation still says so.
    assert "not materialised yet: posteriors" in text


def test_hashes_wrap_and_the_html_carries_the_wrapping_css():
    table = pd.DataFrame({"item": ["settings_sha256"], "registered": [HASH], "ran": [HASH], "deviates": [False]})
    document = render_html("t", "", [FamilyReport(FAMILY, [Section("Deviations", "", table)])])
    assert ".hash{overflow-wrap:anywhere;word-break:break-all}" in document
    assert f'<span class="hash">{HASH}</span>' in document
    cells = _tables(document)["Deviations"][1]
    assert cells == ["settings_sha256", HASH, HASH, "no"]  # the hash's text is whole; the flag reads no


def test_trace_and_rank_plots_for_every_contrast_and_estimands_beside_the_html(settings, tmp_path):
    post = _posteriors(tmp_path)
    sections, _ = family_sections(settings, FAMILY, _tables_in(tmp_path, posteriors=post), {}, UPSTREAM, chains=2)
    by = {s.heading: s for s in sections}
    diagnostics = by["Convergence diagnostics: trace and rank plots"]
    alts = [alt for _, alt in diagnostics.images]
    for name in ("H2", "H3", "H5", "H4"):
        assert f"trace plot of {name}" in alts and f"rank plot of {name}" in alts
    assert all(png.startswith(PNG_MAGIC) for png, _ in diagnostics.images)
    document = render_html("t", "", [FamilyReport(FAMILY, sections)])
    assert document.count('alt="trace plot of ') == 4 and document.count('alt="rank plot of ') == 4
    # The hypotheses table states H3 and H4 as not to be read, as the forest plot does.
    hyp = {row[0]: row for row in _tables(document)["Hypotheses, gates and controls (6.2: 99% HDI, ROPE ±SESOI)"]}
    header = hyp["contrast"]
    assert hyp["H3"][header.index("label as read")] == NOT_CONVERGED_TEXT
    assert hyp["H4"][header.index("label as read")] == NOT_CONVERGED_TEXT
    assert hyp["H2"][header.index("bulk ESS")] == "492"
    # The CSV and JSON hold the HTML's every-estimand rows, with the same formatted labels.
    html_rows = _tables(document)["Every estimand (6.2; 5)"]
    written = write_estimands(tmp_path / "reports", post)
    csv = pd.read_csv(written["estimands_csv"], dtype=str, keep_default_na=False)
    assert [list(csv.columns), *csv.values.tolist()] == html_rows
    records = json.loads((tmp_path / "reports" / ESTIMANDS_JSON).read_text())
    assert [r["label as read"] for r in records] == csv["label as read"].tolist()
    assert [r["contrast"] for r in records] == csv["contrast"].tolist()
    assert records[0]["raw"]["mean"] == post["mean"].iloc[0]
    assert (tmp_path / "reports" / ESTIMANDS_CSV).is_file()
    assert csv.set_index("contrast").loc["exclusions", "estimate is"] == "worst cell exclusion rate"


def test_report_tables_show_no_python_or_json_reprs(settings, tmp_path):
    record = {"protocol": "two-facts-one-gate", "protocol_version": "v", "status": "draft", "mode": "pilot",
              "selected_names": ["Orin", "Tavi"], "depth_band": [1, 2], "pilot_sigma_judge": None,
              "reduced_design": {"reason": "demo"}}
    registration = pd.DataFrame([{"record_json": json.dumps(record), "record_path": "r.json", "gate": "matching (4.3)",
                                  "passed": False, "numbers": json.dumps({"frames passing": 0, "max TOST p": None}),
                                  "message": "write 1 new frame"}])
    reading = pd.DataFrame([{"code": "NO_READING_CONTROLS_FAILED", "row": 1, "qualifiers": "", "flags": "",
                             "h2": "unresolved", "h5": "unresolved", "gate_a": "not_scored", "gate_b": "unresolved",
                             "gate_c": "not_scored", "descriptive_only": True}])
    post = _posteriors(tmp_path)
    document = _document(settings, _tables_in(tmp_path, registration_record=registration, reading=reading,
                                              posteriors=post))
    tables = _tables(document)
    gates = tables["Registration gates (pilot)"]
    assert gates[1][1] == "no" and gates[1][2] == "frames passing: 0; max TOST p: n/a"
    for heading, rows in tables.items():
        for row in rows:
            for cell in row:
                assert not REPRS.search(cell), (heading, cell)


def test_the_cross_family_table_shows_labels_as_pairs_not_json():
    from fear_assets.report.sections import readable_json

    stored = pd.DataFrame([{"families": json.dumps({"qwen2.5-7b": "supported"}), "missing": "gemma-2-9b",
                            "descriptive_only": json.dumps({}), "statement": "no general statement"}])
    shown = readable_json(stored, ["families", "descriptive_only"]).iloc[0]
    assert shown["families"] == "qwen2.5-7b: supported" and shown["descriptive_only"] == "none"
    assert shown["statement"] == "no general statement"


def test_the_reading_section_shows_a_non_converged_gate_label_as_not_to_be_read(settings, tmp_path):
    post = _posteriors(tmp_path)
    post = pd.concat([post, post[post["contrast"] == "H3"].assign(contrast="gate_b_recall_H2", kind="gate")],
                     ignore_index=True)
    reading = pd.DataFrame([{"code": "NO_READING_CONTROLS_FAILED", "row": 1, "qualifiers": "", "flags": "",
                             "h2": "unresolved", "h5": "unresolved", "gate_a": "not_scored", "gate_b": "supported",
                             "gate_c": "not_scored", "descriptive_only": True}])
    sections, _ = family_sections(settings, FAMILY, _tables_in(tmp_path, posteriors=post, reading=reading), {},
                                  UPSTREAM, chains=2)
    labels = {s.heading: s for s in sections}["Section 8 reading: its labels and the estimands"].table
    gate_b = labels.set_index("input").loc["gate_b"]
    assert gate_b["label the reading used"] == "supported"
    assert gate_b["label as read (estimands)"] == NOT_CONVERGED_TEXT
    assert labels.set_index("input").loc["h2", "label as read (estimands)"] == "unresolved"


def _scores(blocks, excluded: bool) -> pd.DataFrame:
    return pd.DataFrame([{"block": b, "depth": "d1", "excluded_context": excluded, "answer_exceeds_context": False,
                          "generation_truncated": False, "item_id": "TER-03", "settings_sha256": "s"} for b in blocks])


def test_a_confirmatory_report_counts_exclusions_of_the_confirmatory_scores_and_lists_every_block(settings, tmp_path):
    """Appendix C step 7 reports the collection: where the family scored confirmatory blocks, the
    exclusions are those of the rows the analysis read (not the pilot's), and the trial
    accounting lists every block of the closed accounting with its rows."""
    pilot = _scores(["pilot_primary"], excluded=False)
    confirmatory = _scores(["primary", "judge", "base_checkpoint"], excluded=True)
    blocks = [b.name for b in settings.blocks]
    accounting = pd.DataFrame([{"family": FAMILY, "block": b, "kind": "agent", "frames": "confirmatory",
                                "n_frames": 5, "expected_rows": 10, "actual_rows": 10, "status": "closed"}
                               for b in blocks])
    tables = _tables(_document(settings, _tables_in(tmp_path, scores=pilot, confirmatory_scores=confirmatory,
                                                    accounting=accounting)))
    exclusions = next(rows for heading, rows in tables.items() if heading.startswith("Exclusions"))
    assert {row[0] for row in exclusions[1:]} == {"primary", "judge", "base_checkpoint"}
    assert all(row[1] == "1" for row in exclusions[1:])
    listed = next(rows for heading, rows in tables.items() if heading.startswith("Trial accounting"))
    assert [row[0] for row in listed[1:]] == blocks
    # A design that scored no confirmatory block (the reduced demo) reports the pilot's rows.
    tables = _tables(_document(settings, _tables_in(tmp_path, scores=pilot, confirmatory_scores=confirmatory.iloc[:0])))
    exclusions = next(rows for heading, rows in tables.items() if heading.startswith("Exclusions"))
    assert [row[0] for row in exclusions[1:]] == ["pilot_primary"]
