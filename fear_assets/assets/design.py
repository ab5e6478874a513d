"""Stage "design" (protocol 4.4, 4.7-4.8, D2, D6): trial table, assignment key, accounting."""


import time

import dagster as dg
import pandas as pd

from fear_assets.design.applicable import not_applicable  # issue 15
from fear_assets.design.accounting import trial_accounting as account
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.masking import assignment_key as make_key
from fear_assets.design.table import build_trial_table
from fear_assets.design.trials import registered_selection
from fear_assets.registration.record import registered_replacements
from fear_assets.errors import DesignError
from fear_assets.lm.name_gate import selected_names
from fear_assets.lm.tokenizers import family_tokenizers
from fear_assets.partitions import (FAMILY_DEPTH_EXPR, FAMILY_EXPR, all_depths_of_family, family_depth_partitions,
                                    family_of_partition, family_partitions, partition_parts)
from fear_assets.resources.protocol import ProtocolResource
from fear_assets.assets.stimuli import frame_bank

GROUP = "design"


def _skip_unregistered(context, settings, family_key: str, depth: str) -> bool:
    family = settings.family(family_key)
    if depth in family.depth_keys:
        return False
    context.log.info(f"{family_key} registers depths {', '.join(family.depth_keys)} only; "
                     f"partition {depth}|{family_key} is not part of its design and is not materialised")
    return True


@dg.asset(
    group_name=GROUP, partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="duckdb",
    output_required=False, kinds={"duckdb", "python"},
    ins={"name_gate": dg.AssetIn(partition_mapping=family_of_partition)},
)
def trial_table(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                frame_bank: pd.DataFrame, name_gate: pd.DataFrame):
    """The masked trial table of one family x depth (protocol 4.4, D2): one row per trial of
    every registered block, naming its block, frame, fear, unit, rotation, pair order, depth
    (index and tokens), content option and masked condition code, with the sha256 of the
    rendered document and of its distractor span. Documents are rendered through the
    reader's chat template; the distractor is cut to exactly the depth's token count and
    shared by the six cells of a unit."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key, depth = partition_parts(context)
    if _skip_unregistered(context, settings, family_key, depth):
        yield dg.Output(pd.DataFrame(), metadata={"not applicable": not_applicable(settings, family_key, depth)})  # issue 15
        return
    stored = set(frame_bank["bank_sha256"])
    if stored != {bank.sha256}:
        raise DesignError(f"frame_bank in DuckDB has bank hash {sorted(stored)} but the bank on disk is "
                          f"{bank.sha256}: re-materialise frame_bank first")
    family = settings.family(family_key)
    depth_index = family.depth_index(depth)
    started = time.perf_counter()
    tokenizers = family_tokenizers(settings, family, protocol.cache_dir)
    names = selected_names(name_gate)
    gate_passed = bool(name_gate["gate_passed"].iloc[0])
    if not gate_passed and settings.mode == "confirmatory":
        # A check blocks only inside its own run; the gate's stored verdict blocks every later one.
        raise dg.Failure(description=f"the name gate failed for {family_key} and the settings are in confirmatory "
                                     "mode: nothing downstream is built. See the name_gate asset's check for which "
                                     "tokenizer splits which name.")
    replacements = registered_replacements(protocol.registration_dir, family_key)
    selection = registered_selection(settings, bank, family, replacements)
    table, _ = build_trial_table(settings, bank, family_key, depth_index, tokenizers, names, selection)
    table["name_gate_passed"] = gate_passed
    elapsed = time.perf_counter() - started
    context.log.info(f"{family_key} {depth}: {len(table)} trials rendered in {elapsed:.1f} s "
                     f"({len(table) / max(elapsed, 1e-9):.0f} trials/s)")
    by_block = table.groupby("block", sort=False).size().reset_index(name="trials")
    sample = table[table["block"].isin(["pilot_primary", "primary"])].head(1)
    sample_doc = ""
    if len(sample):
        builder = DocumentBuilder(settings, bank, family_key, names, tokenizers)
        sample_doc = builder.document_text(sample.iloc[0].to_dict())
    reduced = family.reduced_design
    yield dg.Output(table, metadata={
        "trials": len(table),
        "depth tokens": family.tokens_at(depth_index),
        "distinct distractors": int(table["distractor_sha256"].nunique()),
        "max document tokens": int(table["n_tokens"].max()),
        "design": "reduced (demonstration): " + reduced.reason if reduced else "registered full design",
        "names": ", ".join(names) + ("" if gate_passed else " (NAME GATE FAILED: registered-order stand-ins)"),
        "trials by block": dg.MetadataValue.md(by_block.to_markdown(index=False)),
        "sample document (first primary trial)": dg.MetadataValue.md(f"```\n{sample_doc}\n```"),
    })


@dg.asset(
    group_name=GROUP, partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="duckdb",
    output_required=False, kinds={"duckdb", "python"}, deps=[frame_bank],
)
def assignment_key(context: dg.AssetExecutionContext, protocol: ProtocolResource):
    """D6 masking key of one family x depth: condition code -> condition, agent, content and
    cell index, a seeded permutation per configuration. Stored apart from the trial table;
    only the unmasking step reads it, after scoring is locked."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    if _skip_unregistered(context, settings, family_key, depth):
        yield dg.Output(pd.DataFrame(), metadata={"not applicable": not_applicable(settings, family_key, depth)})  # issue 15
        return
    key = make_key(settings, family_key).assign(depth=depth)
    yield dg.Output(key, metadata={"codes": len(key)})


@dg.asset(
    group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
    kinds={"duckdb", "python"},
    ins={"trial_table": dg.AssetIn(partition_mapping=all_depths_of_family)},
)
def trial_accounting(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                     trial_table: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The closed trial accounting of one family (protocol 4.7, D2): per block, the
    registered count formula, the expected and actual rows and the per-cell (condition
    code) counts; a TOTAL row reconciles the blocks with the whole table."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    selection = registered_selection(settings, bank, family,
                                     registered_replacements(protocol.registration_dir, family_key))
    table = account(settings, family_key, selection, trial_table)
    shown = table[table["status"] != "not applicable"]
    return dg.Output(table, metadata={
        "trials": len(trial_table),
        "depths present": ", ".join(sorted(set(trial_table["depth"]))) if len(trial_table) else "none",
        "blocks off formula": int((table["status"] == "MISMATCH").sum()),
        "accounting": dg.MetadataValue.md(
            shown[["block", "formula", "expected_rows", "actual_rows", "codes_off", "status"]].to_markdown(index=False)),
    })


@dg.asset_check(asset=trial_accounting, blocking=True, description=(
    "D2 closed accounting: every block's rows and every cell's rows equal the registered "
    "formula at the depths materialised, and the blocks sum to the trial table."))
def accounting_closed(trial_accounting: pd.DataFrame) -> dg.AssetCheckResult:
    bad = trial_accounting[trial_accounting["status"] == "MISMATCH"]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="the accounting is closed" if bad.empty else
        f"{len(bad)} block(s) differ from the registered formula: rebuild the trial table from the frozen "
        "settings and bank (a partial or stale partition is the usual cause)",
        metadata={"mismatches": dg.MetadataValue.md(bad.to_markdown(index=False) if len(bad) else "none")},
    )
