"""Assemble one partition of the masked trial table: grid -> documents -> masking."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Mapping, Sequence

import pandas as pd

from fear_assets.core.errors import DesignError
from fear_assets.core.registered import Registered
from fear_assets.design.documents import ChatTokenizer, DocumentBuilder, render_grid
from fear_assets.design.masking import assignment_key, mask
from fear_assets.design.trials import FrameSelection, baseline_per_order, build_grid, registered_selection
from fear_assets.core.settings import ProtocolSettings, depth_key
from fear_assets.lm.tokenizers import family_tokenizers
from fear_assets.stimuli.bank import Bank
from fear_assets.stimuli.name_gate import selected_names

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


class NameGateBlocks(DesignError):
    """The name gate failed for a registered family (confirmatory mode): nothing downstream is built (4.2)."""


@dataclass(frozen=True)
class TrialTableResult:
    """One family x depth of the masked trial table and what a reader checks it by (4.4, D2)."""

    table: pd.DataFrame
    names: list[str]
    gate_passed: bool
    depth_tokens: int
    by_block: pd.DataFrame
    #: The first primary trial's document ('' where the slice has none).
    sample_document: str
    design: str
    seconds: float


def stage_blocks(settings: ProtocolSettings, pilot: bool) -> list[str]:
    """The blocks one stage renders: the pilot's (built from the pilot frames, before
    registration) or the confirmatory ones (Appendix C steps 2 and 5)."""
    return [b.name for b in settings.blocks if b.is_pilot == pilot]


def render_trial_table(frame_bank: pd.DataFrame, name_gate: pd.DataFrame, bank: Bank, view: Registered,
                       cache_dir: Path | str, depth: str, pilot: bool,
                       replacements: Mapping[str, str],
                       directories: Mapping[str, Path] | None = None) -> TrialTableResult:
    """Render one family x depth of the masked trial table for the pilot or the confirmatory
    blocks (4.4, D2), with the frame replacements a registered record makes (4.3), on the
    selected names. Refuses a stored bank other than the one on disk, and, for a registered
    family (confirmatory mode), a failed name gate (:class:`NameGateBlocks`). ``directories``:
    where this host places each checkpoint (its tokenizer renders the documents)."""
    settings, family, family_key = view.settings, view.family, view.family.key
    stored = set(frame_bank["bank_sha256"])
    if stored != {bank.sha256}:
        raise DesignError(f"frame_bank in DuckDB has bank hash {sorted(stored)} but the bank on disk is "
                          f"{bank.sha256}: re-materialise frame_bank first")
    index = family.depth_index(depth)
    started = time.perf_counter()
    tokenizers = family_tokenizers(settings, family, cache_dir, directories)
    names = selected_names(name_gate)
    gate_passed = bool(name_gate["gate_passed"].iloc[0])
    if not gate_passed and view.confirmatory and not view.rehearsal:
        # A check blocks only inside its own run; the gate's stored verdict blocks every later one.
        raise NameGateBlocks(f"the name gate failed for {family_key}, whose registration record is issued "
                             "(confirmatory mode): nothing downstream is built. See the name_gate asset's check for which "
                             "tokenizer splits which name.")
    selection = registered_selection(settings, bank, family, replacements)
    table, _ = build_trial_table(settings, bank, family_key, index, tokenizers, names, selection,
                                 blocks=stage_blocks(settings, pilot))
    table["name_gate_passed"] = gate_passed
    elapsed = time.perf_counter() - started
    by_block = table.groupby("block", sort=False).size().reset_index(name="trials")
    sample = table[table["block"].isin(["pilot_primary", "primary"])].head(1)
    sample_doc = (DocumentBuilder(settings, bank, family_key, names, tokenizers).document_text(sample.iloc[0].to_dict())
                  if len(sample) else "")
    reduced = family.reduced_design
    return TrialTableResult(table, names, gate_passed, family.tokens_at(index), by_block, sample_doc,
                            "reduced (demonstration): " + reduced.reason if reduced else "registered full design",
                            elapsed)
