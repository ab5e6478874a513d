"""The Stage 2 report (protocol Appendix C step 7; 6.2; 8), built only from stored assets.

Appendix C step 7: "Publish: Stage 2 report with all readings from Section 8 stated as they
fall." Step 6: "report every hypothesis and every family." The report states the
registration record, every hypothesis with its 99% HDI and label (6.2), the gates, the
positive controls, the Section 8 reading with its qualifiers and flags, the exclusions, and
a table of deviations computed by comparing the registered record with what ran. Every
table names the materialisation its numbers came from (asset key, partition, run id, data
version), so a reader can find the exact stored rows.

Pure: tables and provenance in, one self-contained HTML string out (inline CSS, figures as
data URIs); the Dagster asset only gathers the inputs and writes the file.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.estimands import estimand_view
from fear_assets.core.numbers import MISSING, Quantity, is_missing, number, yes_no


@dataclass(frozen=True)
class Provenance:
    """One stored materialisation: where a table's numbers came from."""

    asset: str
    partition: str | None
    run_id: str
    data_version: str | None
    timestamp: float | None = None

    def cite(self) -> str:
        part = f" [{self.partition}]" if self.partition else ""
        version = self.data_version or "none recorded"
        return f"{self.asset}{part} · run {self.run_id} · data version {version}"


def cite_all(sources: Sequence[Provenance]) -> str:
    if not sources:
        return "no materialisation recorded in this Dagster instance"
    return "; ".join(p.cite() for p in sources)


@dataclass(frozen=True)
class Section:
    heading: str
    text: str = ""
    table: pd.DataFrame | None = None
    sources: Sequence[Provenance] = ()
    image_png: bytes | None = None
    image_alt: str = ""
    #: Further figures (PNG bytes, alt text), shown in a row after the table.
    images: Sequence[tuple[bytes, str]] = ()


@dataclass
class FamilyReport:
    family: str
    sections: list[Section] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Deviations: the registered record against what ran
# ---------------------------------------------------------------------------------------
DEVIATION_COLUMNS = ["item", "registered", "ran", "deviates", "source"]


def plain(value: object, quantity: Quantity = "estimate") -> str:
    """A stored value as a reader reads it: lists comma-joined, mappings as ``key: value``
    pairs, flags yes/no, numbers by ``core.numbers``, missing as n/a; never a Python or
    JSON repr."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(plain(v, quantity) for v in value) if value else "none"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {plain(v, quantity)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) \
            if value else "none"
    if is_missing(value):
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return yes_no(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return number(value, "count" if isinstance(value, (int, np.integer)) else quantity)
    return str(value)


def _norm(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "none"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, Mapping):
        return plain(dict(value)) if value else "none"
    return str(value)


@dataclass(frozen=True)
class Ran:
    """What the stored assets show ran, one value per compared item, with its source."""

    value: object
    source: str


def deviations(registered: Mapping[str, object], ran: Mapping[str, Ran],
               declared: Sequence[Mapping[str, str]] = (), unordered: Sequence[str] = ()) -> pd.DataFrame:
    """One row per registered item: its registered value, the value the stored assets show
    ran, whether they differ, and where the ran value was read. Items in ``unordered`` are
    compared as sets (frames, checkpoints); a value missing on either side is a deviation
    ("not run" is not "as registered"). ``declared`` are the deviations the registration
    record itself lists (an implementation choice stated before collection): they are
    reported as such, with deviates True, so none is hidden."""
    rows = []
    for item, reg in registered.items():
        if item not in ran:
            rows.append({"item": item, "registered": _norm(reg), "ran": "not found in the stored assets",
                         "deviates": True, "source": "none"})
            continue
        got = ran[item]
        listy = lambda v: isinstance(v, (list, tuple, set, frozenset))
        if item in unordered and listy(reg) and listy(got.value):
            same = {str(v) for v in (reg or [])} == {str(v) for v in (got.value or [])}
            shown_reg, shown_ran = _norm(sorted(map(str, reg or []))), _norm(sorted(map(str, got.value or [])))
        else:
            shown_reg, shown_ran = _norm(reg), _norm(got.value)
            same = shown_reg == shown_ran
        rows.append({"item": item, "registered": shown_reg, "ran": shown_ran, "deviates": not same,
                     "source": got.source})
    for d in declared:
        rows.append({"item": f"declared: {d.get('section', '')}", "registered": d.get("protocol", ""),
                     "ran": f"{d.get('implemented', '')} (why: {d.get('why', '')})", "deviates": True,
                     "source": "registration record (declared before collection)"})
    return pd.DataFrame(rows, columns=DEVIATION_COLUMNS)


# ---------------------------------------------------------------------------------------
# Hypotheses: a label that is not to be read is stated as such
# ---------------------------------------------------------------------------------------
def hypotheses_table(posteriors: pd.DataFrame) -> pd.DataFrame:
    """H1-H5, the gates and the controls with their HDIs and labels (6.2), as the estimands
    view writes them (``analysis.estimands.estimand_view``: one number format, converged
    yes/no, whole ESS). A contrast whose fit missed the convergence rule keeps its numbers
    but its label reads "not converged — not to be read" (6.1), never the label the HDI
    would give: the same words as the forest plot's."""
    need = ["contrast", "kind", "status", "mean", "hdi_low", "hdi_high", "label", "converged"]
    missing = [c for c in need if c not in posteriors.columns]
    if missing:
        raise ValueError(f"posteriors lacks column(s) {missing}: re-materialise posteriors")
    order = {"confirmatory": 0, "gate": 1, "control": 2}
    table = posteriors[posteriors["kind"].isin(list(order))]
    table = table.assign(_order=table["kind"].map(order)).sort_values(["_order", "contrast"], kind="stable")
    return estimand_view(table.drop(columns="_order")).reset_index(drop=True)


# ---------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1300px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.4}
h1{border-bottom:2px solid #333}h2{margin-top:2em;border-bottom:1px solid #ccc}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}th,td{border:1px solid #bbb;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#eee}
table{max-width:100%}td,th{overflow-wrap:break-word;max-width:26em}
.hash{overflow-wrap:anywhere;word-break:break-all}
.source{font-size:.78em;color:#555;margin:.2em 0 1em;overflow-wrap:anywhere}.flag{color:#8b0000}
img{max-width:100%}.figures img{max-width:49%;vertical-align:top}
"""

#: Quantities of the report's numeric columns by name (others: integers as counts, else estimates).
COLUMN_QUANTITIES: Mapping[str, Quantity] = {"accuracy": "probability", "interval_low": "probability",
                                             "interval_high": "probability", "rate": "rate", "rhat": "rhat",
                                             "ess_bulk": "ess", "ess_tail": "ess"}


def table_cells(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s cells as the report writes them (:func:`plain`, numbers by column
    quantity); text cells stay as written, so an already formatted view is not re-parsed."""
    out = {}
    for col in table.columns:
        quantity = COLUMN_QUANTITIES.get(str(col), "estimate")
        out[col] = [plain(v, quantity) for v in table[col]]
    return pd.DataFrame(out, columns=table.columns, index=table.index)


#: A run of this many characters with no space or hyphen (a sha256, a long estimand name or path
#: piece) may wrap anywhere; run ids already break at their hyphens.
LONG_TOKEN = re.compile(r"([^\s<>\-]{24,})")


def wrap_long_tokens(fragment: str) -> str:
    """``fragment`` (escaped HTML) with every long unbroken token (a sha256, a long name) in a
    ``span.hash`` that wraps anywhere, so a table of 64-character hashes fits its page and
    short numbers are never split."""
    return LONG_TOKEN.sub(r'<span class="hash">\1</span>', fragment)


def _table_html(table: pd.DataFrame) -> str:
    return wrap_long_tokens(table_cells(table).to_html(index=False, escape=True, border=0))


def _section_html(section: Section, level: int = 3) -> str:
    import base64

    parts = [f"<h{level}>{html.escape(section.heading)}</h{level}>"]
    if section.text:
        parts += [f"<p>{html.escape(line)}</p>" for line in section.text.split("\n") if line.strip()]
    if section.image_png is not None:
        data = base64.b64encode(section.image_png).decode("ascii")
        parts.append(f'<img alt="{html.escape(section.image_alt)}" src="data:image/png;base64,{data}">')
    if section.table is not None:
        parts.append(_table_html(section.table) if len(section.table) else "<p>none</p>")
    if section.images:
        parts.append('<div class="figures">' + "".join(
            f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
            for png, alt in section.images) + "</div>")
    parts.append(wrap_long_tokens(f'<p class="source">Source: {html.escape(cite_all(section.sources))}</p>'))
    return "\n".join(parts)


def render_html(title: str, preamble: str, families: Sequence[FamilyReport],
                across: Sequence[Section] = ()) -> str:
    """One self-contained HTML document: no external file, script or font."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    body += [f"<p>{html.escape(line)}</p>" for line in preamble.split("\n") if line.strip()]
    for fam in families:
        body.append(f'<h2 id="{html.escape(fam.family)}">Family {html.escape(fam.family)}</h2>')
        body += [_section_html(s) for s in fam.sections]
    if across:
        body.append("<h2>Across families (6.2)</h2>")
        body += [_section_html(s) for s in across]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def html_to_pdf(document: str) -> bytes | None:
    """The PDF of the report where WeasyPrint (PyPI) and its system libraries are present;
    None where they are not (the HTML is the report; the PDF is a convenience)."""
    try:
        from weasyprint import HTML
    except (ImportError, OSError):
        return None
    return HTML(string=document).write_pdf()
