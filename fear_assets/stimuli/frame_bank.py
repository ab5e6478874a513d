"""The frozen frame bank as a table (protocol 4.3, Appendix A): one row per item."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from fear_assets.core.settings import ProtocolSettings
from fear_assets.stimuli.bank import Bank


def bank_table(bank: Bank, settings: ProtocolSettings) -> pd.DataFrame:
    """Every frame and event with its partner, item hash and the bank and settings hashes."""
    rows = []
    hashes = bank.item_hashes()
    for it in sorted((*bank.frames, *bank.events), key=lambda i: (i.kind, i.group, i.number)):
        rows.append({
            "item_id": it.id, "kind": it.kind, "fear": it.group, "frame_set": it.set, "item_number": it.number,
            "sentence": it.sentence, "first_person": it.first_person, "content_removed": it.content_removed,
            "clause": it.clause, "question": it.question, "option_1": it.content_options[0],
            "option_2": it.content_options[1], "verbs": json.dumps(it.verbs, sort_keys=True),
            "partner_sentence": it.partner.sentence, "partner_option_1": it.partner.content_options[0],
            "partner_option_2": it.partner.content_options[1], "partner_question": it.partner.question,
            "item_sha256": hashes[f"item:{it.id}"], "bank_sha256": bank.sha256, "settings_sha256": settings.sha256,
        })
    return pd.DataFrame(rows)


def appendix_a(bank: Bank, settings: ProtocolSettings) -> str:
    """One canonical frame per fear (the protocol's Table A1), rendered for reading."""
    lines = ["| fear | frame | threat (assistant) | harmless (assistant) | human verbs | options |",
             "|---|---|---|---|---|---|"]
    for fear in settings.fears:
        frame = bank.frames_of(fear, "pilot")[0]
        a, p = frame.verbs["assistant"], frame.verbs["person"]
        lines.append(f"| {fear} | {frame.id} | {frame.sentence.format(agent='[Agent]', verb=a['threat'], content='[option]')} "
                     f"| {a['harmless']} | {p['threat']} / {p['harmless']} | {' / '.join(frame.content_options)} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class FrameBankResult:
    table: pd.DataFrame
    #: Items per kind, fear and frame set.
    counts: pd.DataFrame
    #: The canonical frames (Appendix A) as a markdown table.
    appendix_a: str


def frame_bank(bank: Bank, settings: ProtocolSettings) -> FrameBankResult:
    """The stimulus bank as stored (4.3) with its counts and its Appendix A rendering."""
    table = bank_table(bank, settings)
    counts = table.groupby(["kind", "fear", "frame_set"]).size().reset_index(name="items")
    return FrameBankResult(table, counts, appendix_a(bank, settings))
