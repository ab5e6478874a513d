"""4.7 / D2: the closed trial accounting of one configuration.

Reconciles the trial table with the registered count formulas: every block's rows, every
(block, condition code) cell's rows, and the sum over blocks equal to the table's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fear_assets.design.trials import (BINDING_CELLS, FrameSelection, baseline_per_order, block_applies,
                                       block_depths, expected_block_rows, registered_selection)
from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.stimuli.bank import Bank

ACCOUNTING_COLUMNS = ["family", "block", "kind", "frames", "n_frames", "expected_rows", "actual_rows",
                      "expected_per_code", "codes", "codes_off", "status", "formula"]


def _formula(settings: ProtocolSettings, block, family, n_frames: int, depths: list[int]) -> str:
    """The count formula in words, naming any depth a reduced design builds at fewer rotations
    (rotations x depths then counts each depth's own rotations)."""
    thinned = [f"d{d} at rotation {', '.join(map(str, kept))} only" for d in depths
               if len(kept := family.rotations_at(d, settings.rotations)) < len(settings.rotations)]
    suffix = f" (reduced design: {'; '.join(thinned)})" if thinned and block.kind != "binding" else ""
    return _registered_formula(settings, block, n_frames, len(depths)) + suffix


def _registered_formula(settings: ProtocolSettings, block, n_frames: int, n_depths: int) -> str:
    n_rot, n_order = len(settings.rotations), len(settings.orders)
    unit = "events" if block.frames in settings.bank.event_classes else "frames"
    if block.kind == "binding":
        return f"{settings.design.binding_in_context_documents} registered in-context documents"
    if block.kind == "baseline":
        orders = f" x {n_order} orders (the judge's prompt depends on order)" if baseline_per_order(block) else ""
        return f"{n_frames} {unit} x {n_rot} rotations x {n_depths} depths{orders}"
    if block.kind == "no_agent":
        return f"{n_frames} {unit} x {n_rot} rotations x {n_order} orders x {n_depths} depths"
    n_cells = len(settings.cell_set(block.cells))
    cells = "cell" if n_cells == 1 else "cells"
    return f"{n_frames} {unit} x {n_cells} {cells} x {n_rot} rotations x {n_order} orders x {n_depths} depths"


def binding_codes_off(codes: pd.Series, n_cells: int) -> int:
    """How many binding cells break "spread evenly over names, roles and contents" (4.2).

    Forty documents over the six role x content cells cannot be equal, so "evenly" is read
    as the tightest deal there is: every cell present and the counts differing by at most
    one (7, 7, 7, 7, 6, 6). The cells whose count lies outside the even deal's two counts
    (documents // cells and one more) are counted, and a missing cell counts as one off."""
    missing = max(0, n_cells - len(codes))
    if codes.empty:
        return missing
    low = int(codes.sum()) // n_cells  # the even deal's smaller count
    return missing + int(((codes < low) | (codes > low + 1)).sum())


def trial_accounting(settings: ProtocolSettings, family_key: str, selection: FrameSelection,
                     table: pd.DataFrame) -> pd.DataFrame:
    """One row per registered block (plus a TOTAL row): expected vs actual counts."""
    family = settings.family(family_key)
    depths_present = sorted(set(table["depth_index"])) if len(table) else []
    rows = []
    for block in settings.blocks:
        n_frames = len(selection.ids(block.frames))
        part = table[table["block"] == block.name]
        applies = block_applies(block, family)
        expected = expected_block_rows(settings, block, family, n_frames, depths_present)
        depths = [d for d in block_depths(block, family) if d in depths_present]
        codes = part.groupby("condition_code").size() if len(part) else pd.Series(dtype="int64")
        if block.kind == "agent":
            per_code = expected // max(1, len(settings.cell_set(block.cells)))
        elif block.kind == "binding":
            per_code = -1  # spread evenly: counts differ by at most one (checked below)
        else:
            per_code = expected
        if per_code >= 0:
            codes_off = int((codes != per_code).sum())
        else:
            codes_off = binding_codes_off(codes, len(settings.cell_set(BINDING_CELLS))) if expected else 0
        ok = len(part) == expected and codes_off == 0
        rows.append({
            "family": family_key, "block": block.name, "kind": block.kind, "frames": block.frames,
            "n_frames": n_frames, "expected_rows": expected, "actual_rows": len(part),
            "expected_per_code": per_code, "codes": len(codes), "codes_off": codes_off,
            "status": ("ok" if ok else "MISMATCH") if applies else ("not applicable" if len(part) == 0 else "MISMATCH"),
            "formula": _formula(settings, block, family, n_frames, depths) if applies else
            f"not applicable: family {family_key} registers no {block.reader} checkpoint",
        })
    known = {b.name for b in settings.blocks}
    unknown = table[~table["block"].isin(known)]
    total_expected = sum(r["expected_rows"] for r in rows)
    rows.append({
        "family": family_key, "block": "TOTAL", "kind": "all", "frames": "all", "n_frames": 0,
        "expected_rows": total_expected, "actual_rows": len(table), "expected_per_code": -1, "codes": 0,
        "codes_off": 0, "status": "ok" if len(table) == total_expected and unknown.empty else "MISMATCH",
        "formula": "sum of the blocks above" + (f"; {len(unknown)} rows of unregistered blocks" if len(unknown) else ""),
    })
    return pd.DataFrame(rows, columns=ACCOUNTING_COLUMNS)


@dataclass(frozen=True)
class AccountingResult:
    """The closed accounting of one family and the trials it reconciles (4.7, D2)."""

    table: pd.DataFrame
    trials: pd.DataFrame


def close_accounting(pilot_trial_table: pd.DataFrame, confirmatory_trial_table: pd.DataFrame, bank: Bank,
                     view: Registered) -> AccountingResult:
    """The pilot and confirmatory trial tables of one family against the registered count
    formulas (4.7, D2). A registered replacement swaps one frame for another (4.3), so the
    counts the formula reads are those of the registered sets; the frames are the tables'."""
    selection = registered_selection(view.settings, bank, view.family)
    trials = pd.concat([pilot_trial_table, confirmatory_trial_table], ignore_index=True)
    return AccountingResult(trial_accounting(view.settings, view.family.key, selection, trials), trials)


def accounting_verdict(accounting: pd.DataFrame) -> tuple[bool, str, pd.DataFrame]:
    """Closed, or how many blocks differ from the registered formula and the usual cause."""
    bad = accounting[accounting["status"] == "MISMATCH"]
    return (bad.empty, "the accounting is closed" if bad.empty else
            f"{len(bad)} block(s) differ from the registered formula: rebuild the trial tables from the frozen "
            "settings and bank (a partial or stale partition is the usual cause)", bad)
