"""The reading stage's steps (protocol 6.2, 8; D5): one configuration's Section 8 reading as
its stored row, and the cross-family statement as its stored row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from fear_assets.core.settings import Family
from fear_assets.reading.decision import Reading, section8_reading
from fear_assets.analysis.estimands import label_as_read, with_converged
from fear_assets.reading.inputs import GATE_CONTRASTS, cross_family_statement, reading_flags, reading_inputs

#: The reading's fields that come straight from its inputs.
LABELS = ("h2", "h5", "gate_a", "gate_b", "gate_c")
#: The family roles a cross-family statement is about (6.2; the embedded demo does not count).
STATEMENT_ROLES = ("primary", "replication")


@dataclass(frozen=True)
class ReadingResult:
    """One configuration's reading: its stored row and the facts its metadata shows."""

    table: pd.DataFrame
    reading: Reading
    labels: dict[str, str]
    flags: tuple[str, ...]


def family_reading(family_key: str, posteriors: pd.DataFrame, registration_record: pd.DataFrame) -> ReadingResult:
    """The Section 8 reading of one configuration (D5 Table 8): a pure function of the labels of
    H2, H5 and gates (a)-(c) and the flags (controls, binding, power) read from ``posteriors``
    and the stored registration record, with every flag the analysis carries."""
    record = json.loads(registration_record["record_json"].iloc[0])
    args = reading_inputs(posteriors, record)
    reading = section8_reading(**{k: v for k, v in args.items() if k != "in_context"})
    flags = reading_flags(reading, args, posteriors)
    row = {"family": family_key, "code": reading.code, "row": reading.row,
           "qualifiers": "; ".join(reading.qualifiers), "descriptive_only": reading.descriptive_only,
           **{k: args[k] for k in LABELS},
           "controls_failed": args["controls_failed"], "binding_failed": args["binding_failed"],
           "binding_in_context": args["in_context"], "h2_meaningful": args["h2_meaningful"],
           "gates_underpowered": "not run" if args["gates_underpowered"] is None else str(args["gates_underpowered"]),
           "gates_not_scored": ",".join(reading.not_scored_gates), "flags": "; ".join(flags)}
    return ReadingResult(pd.DataFrame([row]), reading, {k: args[k] for k in LABELS}, tuple(flags))


#: The estimand each of the reading's labels comes from.
LABEL_CONTRASTS = {"h2": "H2", "h5": "H5", **GATE_CONTRASTS}


def labels_table(labels: Mapping[str, str], posteriors: pd.DataFrame) -> pd.DataFrame:
    """The reading's inputs as a researcher checks them: each label the reading used beside
    its estimand's label as read (the estimands table's and the forest plot's words), so a
    label whose fit did not converge is never shown as if it could be read."""
    by = {r["contrast"]: r for r in with_converged(posteriors).to_dict("records")}
    rows = []
    for key, value in labels.items():
        contrast = LABEL_CONTRASTS.get(key, key)
        rows.append({"input": key, "estimand": contrast, "label the reading used": str(value).replace("_", " "),
                     "label as read (estimands)": label_as_read(by[contrast]) if contrast in by else "not estimated"})
    return pd.DataFrame(rows, columns=["input", "estimand", "label the reading used", "label as read (estimands)"])


@dataclass(frozen=True)
class StatementResult:
    table: pd.DataFrame
    statement: str


def statement_families(families: Mapping[str, Family]) -> list[str]:
    """The families a statement about current language models is about (6.2: the three
    registered ones; the embedded demonstration family never counts)."""
    return [k for k, f in families.items() if f.role in STATEMENT_ROLES]


def cross_family(section8_reading: pd.DataFrame, families: Mapping[str, Family]) -> StatementResult:
    """6.2: "a statement about current language models in general requires the same label on
    H2 in all three families"; until each has a reading, none is made."""
    result = cross_family_statement(section8_reading, statement_families(families))
    table = pd.DataFrame([{"families": json.dumps(result.labels), "missing": ", ".join(result.missing),
                           "descriptive_only": json.dumps(result.descriptive), "statement": result.statement}])
    return StatementResult(table, result.statement)
