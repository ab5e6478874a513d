"""Wiring shared by several stages' assets (no assets here): running the model over a
request list, the pilot's question answering and the registered fitter. Every rule they
apply lives in the science packages."""

import json
import os
import tempfile
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd

from fear_assets.core.registered import registered
from fear_assets.models.primary_model import Fitter, registered_fitter
from fear_assets.design.applicable import not_applicable
from fear_assets.design.document_scores import ScoringSettings, score_requests
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.requests import build_requests
from fear_assets.design.trials import candidate_frames
from fear_assets.design.table import NameGateBlocks, render_trial_table
from fear_assets.core.hashing import sha256_file
from fear_assets.core.numbers import markdown_table
from fear_assets.defs.modes import named_metadata, table_metadata
from fear_assets.design.score_summary import block_summary, resume_summary
from fear_assets.lm.choices import choice_batch
from fear_assets.lm.integrity import manifest_files
from fear_assets.lm.models import registry
from fear_assets.lm.runner import run
from fear_assets.defs.progress import score_partition
from fear_assets.lm.tokenizers import end_of_turn_ids, family_tokenizers
from fear_assets.design.trial_scores import assemble


def write_features(path: Path, features: np.ndarray) -> str:
    """Atomic .npy write; returns its sha256 (Appendix B: activation checksums)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        np.save(tmp, features)
    os.replace(tmp.name, path)
    return sha256_file(path)


def score_table(context, protocol, language_model, table: pd.DataFrame, family_key: str, depth: str,
                feature_name: str, model_manifest: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict]:
    """Score every trial of ``table`` (one family x depth; 4.5): one loop over the request
    list that never decides what to score. Returns (rows, metadata)."""
    settings, bank = protocol.settings(), protocol.bank()
    view = protocol.view(family_key)
    family = view.family
    reduced = family.reduced_design
    names = json.loads(table["selected_names"].iloc[0])
    specs = registry(settings, family_key)
    parts, all_features, offset, resumed = [], [], 0, {}
    # One builder for every reader: the distractors are cut in the tested tokenizer once.
    builder = DocumentBuilder(settings, bank, family_key, names,
                              family_tokenizers(settings, family, Path(protocol.cache_dir), language_model.directories()))
    for reader, rows in table.groupby("reader", sort=False):
        spec = specs["base" if reader == "base" else reader]
        # The checkpoint's files against the stored manifest before anything is scored (4.1, D6).
        model, tokenizer = language_model.load(
            spec, manifest_files(model_manifest, spec.checkpoint) if model_manifest is not None else None)
        requests = build_requests(rows, bank.templates, builder.document_text,
                                  reduced.branches if reduced is not None else None)
        config = ScoringSettings(spec.context_window, view.generation.max_new_tokens,
                                 view.probe.layers_fraction_from)
        # The host's batch and packing budget (site configuration); the scores do not depend on them.
        engine, eos = language_model.engine(model), end_of_turn_ids(tokenizer)
        # Issue 16: finished chunks survive a crash and a rerun scores only what is missing.
        scored = score_partition(context, requests,
                              lambda reqs, _, engine=engine, tokenizer=tokenizer, config=config, eos=eos:
                              score_requests(engine, tokenizer, reqs, config, eos_ids=eos),
                              protocol.cache_dir, family_key, feature_name, reader,
                              checkpoint=spec.checkpoint, config=vars(config), eos=sorted(eos),
                              settings=settings.sha256, bank=bank.sha256)
        long, readouts, features = scored.long, scored.readouts, scored.features
        resumed[reader] = scored.progress.metadata()
        part = assemble(rows, long, readouts)
        part["feature_row"] = np.where(part["feature_row"] >= 0, part["feature_row"] + offset, -1)
        offset += len(features)
        all_features.append(features)
        part["checkpoint"] = spec.checkpoint
        parts.append(part)
    result = pd.concat(parts, ignore_index=True)
    features = (np.concatenate([f for f in all_features if len(f)]) if any(len(f) for f in all_features)
                else np.zeros((0, 0), np.float32))
    feature_path = Path(protocol.cache_dir).parent / "features" / family_key / f"{feature_name}.npy"
    digest = write_features(feature_path, features)
    result["features_file"] = str(feature_path)
    result["features_sha256"] = digest
    result["settings_sha256"] = settings.sha256
    result["bank_sha256"] = bank.sha256
    return result, named_metadata(context, {
        "trials scored": len(result), "excluded (context window)": int(result["excluded_context"].sum()),
        "generation truncated": int(result["generation_truncated"].sum()),
        "non-finite log-probabilities (flagged, kept out of the models)": int(result["nonfinite_logprob"].sum()),
        "answer cannot fit after the document (recorded, not excluded)": int(result["answer_exceeds_context"].sum()),
        "features": f"{features.shape[0]:,} rows x {features.shape[1] if features.ndim > 1 else 0:,} columns "
                    f"in {feature_path} (sha256 {digest[:12]})",
        "blocks scored": ", ".join(sorted(result["block"].unique())),
        # Only report-scored blocks carry a Delta; the others say what scored them.
        "mean Delta by block (masked cells pooled)": table_metadata(block_summary(result)),
        "resumed scoring (per reader)": table_metadata(resume_summary(resumed)),
    })


def answer(language_model, spec, questions: pd.DataFrame, answers: list[str]) -> list[list[float]]:
    """Log-probabilities of each answer after each question, one prefill per shared prefix."""
    model, tokenizer = language_model.load(spec)
    engine = language_model.engine(model)
    out: list[list[float] | None] = [None] * len(questions)
    parts = list(questions.reset_index(drop=True).groupby("prefix", sort=False))
    batches = [choice_batch(tokenizer, prefix, list(part["body"]), answers) for prefix, part in parts]
    for (_, part), responses in zip(parts, run(engine, batches)):
        for i, response in zip(part.index, responses):
            out[i] = list(response.logprobs)
    return out  # type: ignore[return-value]


def tested_builder(protocol, language_model, family_key: str, names: list[str]):
    """(tested model spec, document builder on its tokenizer) for the pilot's questions."""
    settings, bank = protocol.settings(), protocol.bank()
    spec = registry(settings, family_key)["tested"]
    _, tokenizer = language_model.load(spec)
    return spec, DocumentBuilder(settings, bank, family_key, names, {"tested": tokenizer})


def candidates(settings, bank, family_key: str) -> list[str]:
    """Frames the pilot gates examine (design frames and, where registered, the reserves)."""
    return candidate_frames(settings, bank, settings.family(family_key))


def fitter(settings) -> Fitter:
    """The registered fitter (6.1; ``models.primary_model.registered_fitter``). The priors, the
    sampler and the frame rule are the same for every family, so any family's view serves."""
    return registered_fitter(registered(settings, next(iter(settings.families))))


def not_applicable_output(context, settings, family_key: str, depth: str, band=None) -> dg.Output | None:
    """An empty slice with its reason where a partition has nothing to build: given ``band``,
    a depth outside the pilot's depth band (the run ends green and the UI says why); None where
    the partition is to be built. (A depth the family's design lacks is no partition at all:
    ``defs.partitions``.)"""
    reason = not_applicable(settings, family_key, depth, band)
    if reason is None:
        return None
    context.log.info(f"{depth}|{family_key}: {reason}")
    return dg.Output(pd.DataFrame(), metadata=named_metadata(context, {"not applicable": reason}))


def trial_table_output(context, protocol, frame_bank: pd.DataFrame, name_gate: pd.DataFrame, family_key: str,
                       depth: str, pilot: bool, replacements: dict[str, str], language_model=None) -> dg.Output:
    """One family x depth of the masked trial table (``design.table.render_trial_table``) with
    the metadata a reader checks it by; a failed name gate in confirmatory mode fails the run."""
    try:
        result = render_trial_table(frame_bank, name_gate, protocol.bank(), protocol.view(family_key),
                                    protocol.cache_dir, depth, pilot, replacements,
                                    language_model.directories() if language_model is not None else None)
    except NameGateBlocks as exc:
        raise dg.Failure(description=str(exc)) from exc
    table = result.table
    context.log.info(f"{family_key} {depth}: {len(table)} trials rendered in {result.seconds:.1f} s "
                     f"({len(table) / max(result.seconds, 1e-9):.0f} trials/s)")
    return dg.Output(table, metadata=named_metadata(context, {
        "trials": len(table), "depth tokens": result.depth_tokens,
        "distinct distractors": int(table["distractor_sha256"].nunique()) if len(table) else 0,
        "max document tokens": int(table["n_tokens"].max()) if len(table) else 0,
        "design": result.design,
        "names": ", ".join(result.names) + ("" if result.gate_passed else " (NAME GATE FAILED: registered-order stand-ins)"),
        "frame replacements (registered record)": replacements or "none",
        "trials by block": dg.MetadataValue.md(markdown_table(result.by_block)),
        "sample document (first primary trial)": dg.MetadataValue.md(f"```\n{result.sample_document}\n```"),
    }))

