"""Stage "lm" (protocol 4.1-4.5, Appendix B): model manifest, surprisal, scores."""

import json
import os
import tempfile
import time
from pathlib import Path

import dagster as dg

from fear_assets.report import plots as report_plots  # issue 15: gate figures as metadata
from fear_assets.design.applicable import not_applicable  # issue 15: backfills end green
import numpy as np
import pandas as pd

from fear_assets.deploy import GPU_OP_TAGS
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.trials import candidate_frames, surprisal_items
from fear_assets.hashing import sha256_file
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.models import manifest, manifest_digest, registry
from fear_assets.lm.name_gate import run_name_gate, selected_names
from fear_assets.lm.scoring import ScoringSettings, build_requests, score_requests
from fear_assets.lm.surprisal import sentence_surprisal as compute_surprisal
from fear_assets.lm.tokenizers import family_tokenizers
from fear_assets.lm.trial_scores import assemble
from fear_assets.partitions import (FAMILY_DEPTH_EXPR, FAMILY_EXPR, family_depth_partitions,
                                    family_of_partition, family_partitions, partition_parts)
from fear_assets.modes import GATES_BLOCK
from fear_assets.resources.models import LanguageModelResource
from fear_assets.resources.protocol import ProtocolResource

GROUP = "lm"


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def name_gate(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """The name gate (protocol 4.2): for every tokenizer of the configuration (tested, judge,
    scorer), is each registered name ONE token in every form in which it occurs in the
    documents (mid-sentence, at a line start, at a message start)? The first five names
    passing everywhere are selected; with fewer, the first five in registered order stand in
    and the failure is flagged on everything downstream. Uses the real registered
    tokenizers (scripts/fetch_tokenizers.py), no weights."""
    settings = protocol.settings()
    result = run_name_gate(settings, context.partition_key, Path(protocol.cache_dir))
    table = result.table.assign(family=context.partition_key, selected_names=json.dumps(result.selected),
                                gate_passed=result.passed)
    pivot = table.pivot_table(index="name", columns=["tokenizer", "form"], values="n_tokens", aggfunc="max")
    pivot = pivot.reindex(settings.names)
    return dg.Output(table, metadata={
        "selected names": ", ".join(result.selected),
        "passed": result.passed,
        "verdict": result.message,
        "tokens per name (tokenizer, form)": dg.MetadataValue.md(pivot.to_markdown()),
        "names x tokenizers x forms (SPLIT: more than one token)": dg.MetadataValue.md(report_plots.name_gate_table(table, settings.names).to_markdown()),  # issue 15
        "names x tokenizers x forms (plot)": report_plots.metadata_image(report_plots.name_gate_plot(table, settings.names), "name gate: names x tokenizers x forms"),  # issue 15
    })


@dg.asset_check(asset=name_gate, blocking=GATES_BLOCK, description=(
    "Protocol 4.2 name gate: at least five registered names are single tokens in every form "
    "in every tokenizer of the configuration. Blocking in confirmatory mode."))
def five_single_token_names(name_gate: pd.DataFrame) -> dg.AssetCheckResult:
    passed = bool(name_gate["gate_passed"].iloc[0])
    split = name_gate[~name_gate["single_token"]]
    table = split.groupby(["tokenizer", "form"])["name"].apply(lambda s: ", ".join(s)).reset_index()
    return dg.AssetCheckResult(
        passed=passed,
        description=("five names pass: " + ", ".join(selected_names(name_gate))) if passed else
        "fewer than five registered names are single tokens everywhere; the first five in registered order stand "
        "in and every downstream output is flagged. Before registration: choose other names or other "
        "judge/scorer checkpoints (a protocol amendment), then re-run the gate.",
        metadata={"which tokenizer splits which name": dg.MetadataValue.md(table.to_markdown(index=False))},
    )


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"}, deps=["frame_bank"])
def name_candidates(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """Names for a registration amendment (protocol 4.2; DECISIONS 8): every candidate of the
    list shipped with the bank (data/bank/name_candidates.yaml), measured as the name gate
    measures the registered names (token count in every tokenizer of the configuration, in
    every form names occur in), and the first five passing everywhere, in the list's fixed
    alphabetical order, proposed. It never changes the registered names: applying a proposal
    is an explicit settings edit recorded as an amendment in the registration record."""
    from fear_assets.lm.name_candidates import load_candidates, proposal_message, propose_names, single_token_counts
    from fear_assets.lm.name_gate import configuration_tokenizers

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    candidates = load_candidates(Path(protocol.bank_dir), settings.names, bank.canonical_text())
    k = settings.selected_name_count
    proposal = propose_names(candidates, configuration_tokenizers(settings, family_key, Path(protocol.cache_dir)), k)
    table = proposal.table.assign(family=family_key, tokens=proposal.table["tokens"].map(" ".join))
    return dg.Output(table, metadata={
        "proposed (not applied)": ", ".join(proposal.proposed) or "none",
        "complete proposal": proposal.complete,
        "candidates passing everywhere": f"{len(proposal.passing)} of {len(candidates)}: {', '.join(proposal.passing)}",
        "verdict": proposal_message(family_key, proposal, len(candidates), k),
        "single-token candidates per tokenizer and form": dg.MetadataValue.md(
            single_token_counts(proposal.table).to_markdown()),
    })


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
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
    "later run must match its frozen part: settings, bank, model manifest and analysis code. "
    "Blocking in confirmatory mode."))
def matches_registration_record(protocol: ProtocolResource, model_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    from fear_assets.registration.record import analysis_code_sha256, frozen_differences, read_family_record

    family = str(model_manifest["family"].iloc[0])
    record = read_family_record(protocol.registration_dir, family)
    if record is None:
        return dg.AssetCheckResult(passed=True, description="no registration record yet: nothing to compare",
                                   metadata={"record": "none"})
    settings, bank = protocol.settings(), protocol.bank()
    current = {"settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
               "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256()}
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


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
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


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS)
def base_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                            language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the family's base checkpoint (4.3): the
    base-against-assistant comparison uses only frames that pass matching under both
    checkpoints of the lineage. Empty (with a note) for a family without a base checkpoint."""
    from fear_assets.lm.surprisal import SURPRISAL_COLUMNS

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


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS)
def judge_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                             language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the foreign judge, after its own
    third-person system prompt (4.3, 4.8): gate (c)'s joint model gives each reader its own
    surprisal covariates. Empty (with a note) where the family scores no judge block (the
    embedded demo), so gate (c) then says it is not available. Names are the name gate's
    selection, as in the documents (4.2)."""
    from fear_assets.lm.surprisal import SURPRISAL_COLUMNS

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


def _write_features(path: Path, features: np.ndarray) -> str:
    """Atomic .npy write; returns its sha256 (Appendix B: activation checksums)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        np.save(tmp, features)
    os.replace(tmp.name, path)
    return sha256_file(path)


def _score_table(context, protocol: ProtocolResource, language_model: LanguageModelResource, table: pd.DataFrame,
                 family_key: str, depth: str, feature_name: str) -> tuple[pd.DataFrame, dict]:
    """Score every trial of ``table`` (one family x depth); returns (rows, metadata)."""
    settings, bank = protocol.settings(), protocol.bank()
    family = settings.family(family_key)
    reduced = family.reduced_design
    names = json.loads(table["selected_names"].iloc[0])
    specs = registry(settings, family_key)
    gen = settings.section("generation")
    parts, all_features, offset = [], [], 0
    # One builder for every reader: the distractors are cut in the tested tokenizer once.
    builder = DocumentBuilder(settings, bank, family_key, names,
                              family_tokenizers(settings, family, Path(protocol.cache_dir)))
    for reader, rows in table.groupby("reader", sort=False):
        spec = specs["base" if reader == "base" else reader]
        model, tokenizer = language_model.load(spec)
        requests = build_requests(rows, bank.templates, builder.document_text,
                                  reduced.branches if reduced is not None else None)
        eos = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
               if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id]
        last_log = [0.0]

        def progress(done, total, elapsed):
            if elapsed - last_log[0] >= 15 or done == total:
                last_log[0] = elapsed
                rate = done / max(elapsed, 1e-9)
                context.log.info(f"{family_key} {depth} [{reader}]: {done}/{total} documents, {rate:.2f} docs/s, "
                                 f"ETA {(total - done) / max(rate, 1e-9):.0f} s")

        config = ScoringSettings(spec.context_window, int(gen["max_new_tokens"]),
                                 float(settings.section("probe")["layers_fraction_from"]))
        long, readouts, features = score_requests(TeacherForcedEngine(model), tokenizer, requests, config,
                                                  progress=progress, eos_ids=eos)
        part = assemble(rows, long, readouts)
        part["feature_row"] = np.where(part["feature_row"] >= 0, part["feature_row"] + offset, -1)
        offset += len(features)
        all_features.append(features)
        part["checkpoint"] = spec.checkpoint
        parts.append(part)
    result = pd.concat(parts, ignore_index=True)
    features = np.concatenate([f for f in all_features if len(f)]) if any(len(f) for f in all_features) else np.zeros((0, 0), np.float32)
    feature_path = Path(protocol.cache_dir).parent / "features" / family_key / f"{feature_name}.npy"
    digest = _write_features(feature_path, features)
    result["features_file"] = str(feature_path)
    result["features_sha256"] = digest
    result["settings_sha256"] = settings.sha256
    result["bank_sha256"] = bank.sha256
    summary = result.groupby("block")[["delta", "delta_recall"]].mean().round(4)
    return result, {
        "trials scored": len(result), "excluded (context window)": int(result["excluded_context"].sum()),
        "generation truncated": int(result["generation_truncated"].sum()),
        "answer cannot fit after the document (recorded, not excluded)": int(result["answer_exceeds_context"].sum()),
        "features": f"{features.shape} in {feature_path} (sha256 {digest[:12]})",
        "blocks scored": ", ".join(sorted(result["block"].unique())),
        "mean Delta by block (masked cells pooled)": dg.MetadataValue.md(summary.to_markdown()),
    }


def _pilot_control_blocks(settings) -> set[str]:
    return set(settings.section("positive_controls")["pilot_blocks"])


@dg.asset(group_name=GROUP, partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="gpu",
          output_required=False, kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS)
def scores(context: dg.AssetExecutionContext, protocol: ProtocolResource, language_model: LanguageModelResource,
           trial_table: pd.DataFrame):
    """Teacher-forced scores of one family x depth (protocol 4.5): one immutable row per trial
    with the canonical reports' mean and summed log-probabilities in the document and in its
    distractor-only baseline, Delta (and its summed, first-person and recall versions), the
    forced-choice probabilities, the greedy answer with its truncation flag, attention mass
    to each sentence, and the residual-feature row (features in a checksummed .npy file).
    One prefill per document; documents over the context window are excluded with a reason.
    The pilot's positive-control blocks are scored later, at the band depths only
    (``pilot_control_scores``)."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    family = settings.family(family_key)
    if depth not in family.depth_keys or trial_table.empty:
        context.log.info(f"{depth}|{family_key} is not part of the family's design: not scored")
        if not_applicable(settings, family_key, depth):  # issue 15: an empty slice, green, with its reason
            yield dg.Output(pd.DataFrame(), metadata={"not applicable": not_applicable(settings, family_key, depth)})
        return
    table = trial_table[~trial_table["block"].isin(_pilot_control_blocks(settings))]
    if family.reduced_design is not None:
        table = table[table["block"].isin(family.reduced_design.scored_blocks)]
    result, metadata = _score_table(context, protocol, language_model, table, family_key, depth, depth)
    yield dg.Output(result, metadata=metadata)


@dg.asset(group_name=GROUP, partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR, pool="gpu",
          output_required=False, kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS,
          ins={"pilot_depths": dg.AssetIn(partition_mapping=family_of_partition)})
def pilot_control_scores(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                         language_model: LanguageModelResource, trial_table: pd.DataFrame,
                         pilot_depths: pd.DataFrame):
    """The pilot's positive-control documents (protocol 4.6, D4), scored after the depth band
    is fixed and only at the band depths (Appendix C step 2: their contrasts are averaged
    over the band). A depth outside the band materialises nothing."""
    settings = protocol.settings()
    family_key, depth = partition_parts(context)
    band = {f"d{b}" for b in str(pilot_depths["depth_band"].iloc[0]).split(",")}
    if depth not in band or trial_table.empty:
        context.log.info(f"{depth} is not in the depth band {sorted(band)}: the pilot controls are not scored here")
        if not_applicable(settings, family_key, depth, band):  # issue 15: an empty slice, green, with its reason
            yield dg.Output(pd.DataFrame(), metadata={"not applicable": not_applicable(settings, family_key, depth, band)})
        return
    from fear_assets.design.table import baseline_block_for

    blocks = _pilot_control_blocks(settings)
    # A control without its own baseline block (marked priority) is corrected by the default
    # baseline, which is re-scored here with it: its reports are the control's continuations.
    blocks |= {b for b in (baseline_block_for(settings, name) for name in blocks) if b}
    table = trial_table[trial_table["block"].isin(blocks)]
    if table.empty:
        context.log.info(f"{depth}|{family_key}: no pilot control blocks in the trial table")
        return
    result, metadata = _score_table(context, protocol, language_model, table, family_key, depth,
                                    f"{depth}_pilot_controls")
    yield dg.Output(result, metadata=metadata)
