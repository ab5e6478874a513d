"""Assemble one partition of the masked trial table: grid -> documents -> masking."""

from __future__ import annotations

import json
from typing import Collection, Mapping, Sequence

import pandas as pd

from fear_assets.design.documents import ChatTokenizer, DocumentBuilder, render_grid
from fear_assets.design.masking import assignment_key, mask
from fear_assets.design.trials import FrameSelection, baseline_per_order, build_grid
from fear_assets.core.settings import ProtocolSettings, depth_key
from fear_assets.stimuli.bank import Bank

TRIAL_COLUMNS = [
    "trial_id", "family", "depth", "depth_index", "depth_tokens", "block", "block_kind", "reader", "frame_set",
    "prompt", "sentence_form", "item_id", "fear", "item_number", "unit_id", "baseline_unit_id", "rotation",
    "order", "rotation_order_index", "condition_code", "content_option", "partner_option", "fc_first_listed",
    "judge_self_first", "version", "n_prefix_tokens", "n_distractor_tokens", "n_tokens", "document_sha256",
    "distractor_sha256", "prefix_text", "suffix_text", "forced_choice_prompt", "continuations",
    "selected_names", "settings_sha256", "bank_sha256",
]


def baseline_block_for(settings: ProtocolSettings, block_name: str) -> str | None:
    """The distractor-only baseline block whose reports correct this block's (4.5).

    Same frames and reader, same system-prompt condition where one is registered, else the
    default condition (the marked-priority control, probe and content-removed blocks share
    the default system prompt)."""
    block = next(b for b in settings.blocks if b.name == block_name)
    if block.kind == "baseline":
        return None
    candidates = [b for b in settings.blocks if b.kind == "baseline" and b.frames == block.frames
                  and b.reader == block.reader]
    for cond in (block.condition, "default"):
        for b in candidates:
            if b.condition == cond:
                return b.name
    return None


def _unit_ids(grid: pd.DataFrame, settings: ProtocolSettings) -> tuple[pd.Series, pd.Series]:
    """(unit id, baseline unit id). A baseline built per order (the judge's: ``baseline_per_order``)
    carries the order in its unit id, and its documents point at the baseline of their own order."""
    baseline_of = {b.name: baseline_block_for(settings, b.name) for b in settings.blocks}
    per_order = {b.name for b in settings.blocks if baseline_per_order(b)}
    is_baseline = grid["block_kind"] == "baseline"
    unit = grid["block"] + "|" + grid["item_id"] + "|r" + grid["rotation"].astype(str)
    with_order = ~is_baseline | grid["block"].isin(per_order)
    unit = unit.where(~with_order, unit + "|o" + grid["order"].astype(str)) + "|" + grid["depth"]
    bblock = grid["block"].map(baseline_of)
    baseline_unit = bblock + "|" + grid["item_id"] + "|r" + grid["rotation"].astype(str)
    baseline_unit = baseline_unit.where(~bblock.isin(per_order), baseline_unit + "|o" + grid["order"].astype(str))
    baseline_unit = baseline_unit + "|" + grid["depth"]
    return unit, baseline_unit.where(bblock.notna(), "")


def build_trial_table(settings: ProtocolSettings, bank: Bank, family_key: str, depth_index: int,
                      tokenizers: Mapping[str, ChatTokenizer], names: Sequence[str],
                      selection: FrameSelection | None = None,
                      blocks: Collection[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(masked trial table, assignment key) of one family x depth partition; ``blocks``
    restricts it to those blocks (the pilot's table, the confirmatory table). A row does not
    depend on which other blocks are rendered with it.

    Byte-identical for identical inputs: rows in design order, no timestamps.
    """
    grid = build_grid(settings, bank, family_key, depth_indices=[depth_index], selection=selection)
    if blocks is not None:
        grid = grid[grid["block"].isin(set(blocks))].reset_index(drop=True)
    builder = DocumentBuilder(settings, bank, family_key, names, tokenizers)
    rendered = render_grid(builder, grid)
    key = assignment_key(settings, family_key)
    table = mask(rendered, key)
    table["unit_id"], table["baseline_unit_id"] = _unit_ids(table, settings)
    table["trial_id"] = (table["family"] + "|" + table["unit_id"] + "|" + table["condition_code"] + "|"
                         + table["version"])
    table["selected_names"] = json.dumps(list(names))
    table["settings_sha256"] = settings.sha256
    table["bank_sha256"] = bank.sha256
    if table["trial_id"].duplicated().any():
        dup = table.loc[table["trial_id"].duplicated(), "trial_id"].iloc[0]
        raise AssertionError(f"duplicate trial id {dup}: the design generator produced the same trial twice")
    key = key.assign(depth=depth_key(depth_index))
    return table[TRIAL_COLUMNS].reset_index(drop=True), key
