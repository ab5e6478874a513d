"""The model manifest and the document-free surprisal of every sentence (protocol 4.1, 4.3,
Appendix B): what matching (4.3) and the covariates (D3b) read."""

from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.core.numbers import number
from fear_assets.defs.automation import MODEL_RETRY, model_step
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.lm.models import registry
from fear_assets.pilot.manifest import model_manifest as model_manifest_step
from fear_assets.pilot.surprisal import SurprisalResult, reader_surprisal
from fear_assets.registration.record import read_family_record
from fear_assets.registration.record_check import record_match
from fear_assets.stimuli.name_gate import selected_names
from fear_assets.stimuli.tokenizer_agreement import family_tokenizer_agreement, tokenizer_agreement_description


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def model_manifest(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   language_model: LanguageModelResource) -> dg.Output[pd.DataFrame]:
    """The model manifest of one configuration (protocol 4.1, Appendix B): per role (tested,
    base, scorer, judge) the checkpoint, dtype, context window, attention implementation,
    the sha256 of every weight, config and tokenizer file, and the library versions. Weights
    are never downloaded: a missing model fails with what to place where. The directories are
    the ones the models load from (the site configuration's ``checkpoints``)."""
    result = model_manifest_step(protocol.view(context.partition_key), Path(protocol.cache_dir),
                                 language_model.directories(), language_model.site_path())
    return dg.Output(result.table, data_version=dg.DataVersion(result.digest), metadata=named_metadata(context, {
        "manifest_sha256": result.digest, "checkpoints": md_table(result.shown),
        "stand-in": protocol.settings().family(context.partition_key).stand_in or "none",
    }))


@dg.asset_check(asset=model_manifest, blocking=True, description=GATE_DESCRIPTION + (
    "D6: once a registration record exists for the family (data/registration/<family>/), every "
    "later run must match its frozen part: settings, bank, model manifest, analysis code (every package "
    "but the Dagster wiring) and the supplementary note. "
    "Blocking once the family's record is issued; a draft's difference only warns."))
def matches_registration_record(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource,
                                model_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    family = str(model_manifest["family"].iloc[0])
    record = read_family_record(protocol.registration_dir, family)
    if record is None:
        return gate_result(context, model_manifest, passed=True,
                           description="no registration record yet: nothing to compare", metadata={"record": "none"})
    match = record_match(record, protocol.settings(), protocol.bank(), model_manifest)
    return gate_result(
        context, model_manifest, passed=match.passed,
        severity=gate_severity(protocol, context, model_manifest, stops=match.frozen),
        description=match.description, metadata={"status": record["status"], "differences": match.differences})


@dg.asset_check(asset=model_manifest, blocking=True, description=GATE_DESCRIPTION + tokenizer_agreement_description())
def tokenizer_agreement(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource,
                        language_model: LanguageModelResource, model_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    family = str(model_manifest["family"].iloc[0])
    result = family_tokenizer_agreement(protocol.settings(), family, protocol.bank(), Path(protocol.cache_dir),
                                        language_model.directories(), language_model.site_path())
    return gate_result(context, model_manifest, passed=result.passed, description=result.description,
                       severity=gate_severity(protocol, context, model_manifest), metadata={
        "strings compared": dg.MetadataValue.int(int(result.table["strings_compared"].sum())),
        "per checkpoint": md_table(result.table.drop(columns="message"))})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS,
          retry_policy=MODEL_RETRY)
@model_step
def sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                       language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Document-independent surprisal (protocol 4.3): every agent and partner sentence scored
    once after the system prompt with no document, under the tested checkpoint; mean
    per-token NLL of the name token(s) and of the rest, per rotation and content option.
    Covers the design's frames, every reserve frame (candidates for replacement) and the
    design's secondary-class events (agentless: one sentence per option and rotation, matched
    to the agent frames). Names are the name gate's selection, the same names the documents
    carry (4.2)."""
    result, _ = _surprisal(context, protocol, language_model, name_gate, "tested")
    table = result.table
    return dg.Output(table, metadata=named_metadata(context, {
        "sentences": len(table), "frames": result.frames, "seconds": number(result.seconds, "seconds"),
        "names": ", ".join(result.names),
        "mean rest NLL by agent": md_table(table.groupby("agent")[["rest_nll", "name_nll"]].mean(), index=True),
    }))


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS,
          retry_policy=MODEL_RETRY)
@model_step
def base_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                            language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the family's base checkpoint (4.3): the
    base-against-assistant comparison uses only frames that pass matching under both
    checkpoints of the lineage. Empty (with a note) for a family without a base checkpoint."""
    return _surprisal_output(context, _surprisal(context, protocol, language_model, name_gate, "base"))


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, deps=["frame_bank", "model_manifest"], op_tags=GPU_OP_TAGS,
          retry_policy=MODEL_RETRY)
@model_step
def judge_sentence_surprisal(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                             language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The same document-independent surprisal under the foreign judge, after its own
    third-person system prompt (4.3, 4.8): gate (c)'s joint model gives each reader its own
    surprisal covariates. Empty (with a note) where the family scores no judge block (the
    embedded demo), so gate (c) then says it is not available. Names are the name gate's
    selection, as in the documents (4.2)."""
    return _surprisal_output(context, _surprisal(context, protocol, language_model, name_gate, "judge"))


def _surprisal(context, protocol: ProtocolResource, language_model: LanguageModelResource, name_gate: pd.DataFrame,
               role: str) -> tuple[SurprisalResult, str]:
    """One reader's surprisal (``pilot.surprisal.reader_surprisal``) on the model resource,
    with the checkpoint it ran under."""
    settings, family_key = protocol.settings(), context.partition_key
    spec = registry(settings, family_key)[role]
    load = (lambda: language_model.load(spec)) if spec is not None else None
    result = reader_surprisal(load, protocol.bank(), selected_names(name_gate), protocol.view(family_key),
                              role, context.log.info)
    return result, spec.checkpoint if spec is not None else ""


def _surprisal_output(context, run: tuple[SurprisalResult, str]) -> dg.Output:
    result, checkpoint = run
    if result.note is not None:
        return dg.Output(result.table, metadata=named_metadata(context, {"note": result.note}))
    return dg.Output(result.table, metadata=named_metadata(context, {"sentences": len(result.table),
                                                                      "checkpoint": checkpoint}))
