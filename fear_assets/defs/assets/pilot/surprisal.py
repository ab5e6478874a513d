"""The model manifest and the document-free surprisal of every sentence (protocol 4.1, 4.3,
Appendix B): what matching (4.3) and the covariates (D3b) read."""

import json
import time
from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.trials import candidate_frames, surprisal_items
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.models import manifest, manifest_digest, registry
from fear_assets.stimuli.name_gate import selected_names
from fear_assets.pilot.surprisal import SURPRISAL_COLUMNS
from fear_assets.pilot.surprisal import sentence_surprisal as compute_surprisal
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.registration.compose import note_now
from fear_assets.registration.record import analysis_code_sha256, frozen_differences, read_family_record
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def model_manifest(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """The model manifest of one configuration (protocol 4.1, Appendix B): per role (tested,
    base, scorer, judge) the checkpoint, dtype, context window, attention implementation,
    the sha256 of every weight, config and tokenizer file, and the library versions. Weights
    are never downloaded: a missing model fails with what to place where."""
    settings = protocol.settings()
    family = context.partition_key
    rows, seen = [], {}
    for role, spec in registry(settings, family).items():
        if spec is None:
            rows.append({"family": family, "role": role, "checkpoint": "not available", "file": "", "sha256": "",
                         "dtype": "", "context_window": 0, "attn_implementation": "", "versions": ""})
            continue
        if spec.checkpoint not in seen:
            seen[spec.checkpoint] = manifest(spec, Path(protocol.cache_dir))
        m = seen[spec.checkpoint]
        for name, digest in {**m["files"], **{f"source:{k}": v for k, v in m["source_files"].items()}}.items():
            rows.append({"family": family, "role": role, "checkpoint": spec.checkpoint, "file": name, "sha256": digest,
                         "dtype": spec.dtype, "context_window": spec.context_window,
                         "attn_implementation": spec.attn_implementation, "versions": json.dumps(m["versions"])})
    table = pd.DataFrame(rows)
    digest = manifest_digest(table)
    shown = table.groupby(["role", "checkpoint"]).size().reset_index(name="files")
    return dg.Output(table, data_version=dg.DataVersion(digest), metadata={
        "manifest_sha256": digest, "checkpoints": dg.MetadataValue.md(shown.to_markdown(index=False)),
        "stand-in": settings.family(family).stand_in or "none",
    })


@dg.asset_check(asset=model_manifest, blocking=GATES_BLOCK, description=(
    "D6: once a registration record exists for the family (data/registration/<family>/), every "
    "later run must match its frozen part: settings, bank, model manifest, analysis code (every package "
    "but the Dagster wiring) and the supplementary note. "
    "Blocking in confirmatory mode."))
def matches_registration_record(protocol: ProtocolResource, model_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    family = str(model_manifest["family"].iloc[0])
    record = read_family_record(protocol.registration_dir, family)
    if record is None:
        return dg.AssetCheckResult(passed=True, description="no registration record yet: nothing to compare",
                                   metadata={"record": "none"})
    settings, bank = protocol.settings(), protocol.bank()
    current = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
               "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256(),
               **note_now(record)}
    diffs = frozen_differences(record, current)
    return dg.AssetCheckResult(
        passed=not diffs,
        # Only a registered record is frozen; a draft or refused one is rewritten by the next
        # registration_record run (the fix after a failed gate), so differing from it only warns.
        severity=dg.AssetCheckSeverity.ERROR if record["status"] == "registered" else dg.AssetCheckSeverity.WARN,
        description=f"matches the {record['status']} registration record" if not diffs else
        "differs from the " + record["status"] + " registration record: " + "; ".join(diffs) +
        (". Restore the registered inputs, or file an amendment." if record["status"] == "registered" else
         ". The pilot's draft record is rewritten when registration_record is next materialised."),
        metadata={"status": record["status"], "differences": len(diffs)})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS)
def sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                       language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Document-independent surprisal (protocol 4.3): every agent and partner sentence scored
    once after the system prompt with no document, under the tested checkpoint; mean
    per-token NLL of the name token(s) and of the rest, per rotation and content option.
    Covers the design's frames, every reserve frame (candidates for replacement) and the
    design's secondary-class events (agentless: one sentence per option and rotation, matched
    to the agent frames). Names are the name gate's selection, the same names the documents
    carry (4.2)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    spec = registry(settings, family_key)["tested"]
    model, tokenizer = language_model.load(spec)
    ids = surprisal_items(settings, bank, family)
    builder = DocumentBuilder(settings, bank, family_key, selected_names(name_gate), {"tested": tokenizer})
    started = time.perf_counter()
    table = compute_surprisal(TeacherForcedEngine(model), tokenizer, builder, [bank.item(i) for i in ids],
                              log=context.log.info)
    return dg.Output(table, metadata={
        "sentences": len(table), "frames": len(ids), "seconds": round(time.perf_counter() - started, 1),
        "names": ", ".join(builder.names),
        "mean rest NLL by agent": dg.MetadataValue.md(
            table.groupby("agent")[["rest_nll", "name_nll"]].mean().round(3).to_markdown()),
    })


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS)
def base_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                            language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the family's base checkpoint (4.3): the
    base-against-assistant comparison uses only frames that pass matching under both
    checkpoints of the lineage. Empty (with a note) for a family without a base checkpoint."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    spec = registry(settings, family_key)["base"]
    if spec is None:
        return dg.Output(pd.DataFrame(columns=SURPRISAL_COLUMNS).assign(family=family_key),
                         metadata={"note": "no base checkpoint registered: base analyses are not available"})
    model, tokenizer = language_model.load(spec)
    ids = candidate_frames(settings, bank, settings.family(family_key))
    builder = DocumentBuilder(settings, bank, family_key, selected_names(name_gate), {"tested": tokenizer})
    table = compute_surprisal(TeacherForcedEngine(model), tokenizer, builder, [bank.item(i) for i in ids],
                              log=context.log.info)
    return dg.Output(table, metadata={"sentences": len(table), "checkpoint": spec.checkpoint})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS)
def judge_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                             language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the foreign judge, after its own
    third-person system prompt (4.3, 4.8): gate (c)'s joint model gives each reader its own
    surprisal covariates. Empty (with a note) where the family scores no judge block (the
    embedded demo), so gate (c) then says it is not available. Names are the name gate's
    selection, as in the documents (4.2)."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    judge_blocks = [b.name for b in settings.blocks if b.reader == "judge" and b.kind != "baseline"]
    scored = family.reduced_design.scored_blocks if family.reduced_design else judge_blocks
    if not set(judge_blocks) & set(scored):
        return dg.Output(pd.DataFrame(columns=SURPRISAL_COLUMNS).assign(family=family_key),
                         metadata={"note": "no judge block is scored for this family: gate (c) is not available"})
    spec = registry(settings, family_key)["judge"]
    model, tokenizer = language_model.load(spec)
    ids = candidate_frames(settings, bank, family)
    builder = DocumentBuilder(settings, bank, family_key, selected_names(name_gate), {"judge": tokenizer})
    table = compute_surprisal(TeacherForcedEngine(model), tokenizer, builder, [bank.item(i) for i in ids],
                              log=context.log.info, reader="judge")
    return dg.Output(table, metadata={"sentences": len(table), "checkpoint": spec.checkpoint})
