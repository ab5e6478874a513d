"""Stage "stimuli" (protocol 4.2-4.3, Appendix A): the frozen frame bank and the names."""

from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.core.errors import FreezeError
from fear_assets.defs.metadata import metadata_image
from fear_assets.core.numbers import passed_failed
from fear_assets.defs.modes import GATE_DESCRIPTION, gate_result, gate_severity, md_table, named_metadata
from fear_assets.defs.partitions import DEFINITION_SETTINGS, FAMILY_EXPR, family_partitions
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.registration.freeze import compare_with_record, read_record
from fear_assets.report import plots as report_plots
from fear_assets.stimuli.frame_bank import frame_bank as frame_bank_step
from fear_assets.stimuli.name_candidates import name_candidates as name_candidates_step
from fear_assets.stimuli.name_candidates import single_token_counts
from fear_assets.stimuli.name_gate import name_gate as name_gate_step
from fear_assets.stimuli.name_gate import name_gate_description, name_gate_verdict


@dg.asset(pool="duckdb", kinds={"duckdb", "python"})
def frame_bank(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """The stimulus bank (protocol 4.3): 80 agent frames (16 per fear: 2 pilot, 10
    confirmatory, 4 reserve), 20 generic aversive and 20 surprise-only events, each with
    its neutral partner, validated once at load. Its data version is the canonical sha256
    of the bank, so anything built from another bank is visibly stale."""
    settings, bank = protocol.settings(), protocol.bank()
    result = frame_bank_step(bank, settings)
    context.log.info(f"bank {bank.sha256[:12]}: {len(bank.frames)} frames, {len(bank.events)} events")
    return dg.Output(
        result.table,
        data_version=dg.DataVersion(bank.sha256),
        metadata={
            "bank_sha256": bank.sha256,
            "settings_sha256": settings.sha256,
            "frames": len(bank.frames),
            "events": len(bank.events),
            "items by fear and set": md_table(result.counts),
            "canonical frames (Appendix A)": dg.MetadataValue.md(result.appendix_a),
        },
    )


@dg.asset_check(asset=frame_bank, blocking=True, description=(
    "D6 freeze gate: the bank and the registered settings must match the frozen registration "
    "record under data/registration/. On a mismatch nothing downstream runs; the check names "
    "each bank item and settings section that changed."))
def bank_freeze(protocol: ProtocolResource) -> dg.AssetCheckResult:
    settings, bank = protocol.settings(), protocol.bank()
    try:
        record = read_record(protocol.registration_dir)
    except FreezeError as exc:
        return dg.AssetCheckResult(passed=False, description=str(exc),
                                   metadata={"what to do": "freeze the inputs, then commit the record"})
    result = compare_with_record(settings, bank, record)
    return dg.AssetCheckResult(
        passed=result.passed,
        description=result.summary(),
        metadata={
            "bank_sha256 (now)": result.bank_sha256,
            "bank_sha256 (frozen)": result.frozen_bank_sha256,
            "settings_sha256 (now)": result.settings_sha256,
            "settings_sha256 (frozen)": result.frozen_settings_sha256,
            "changed": dg.MetadataValue.md("\n".join(f"- {c}" for c in result.changed) or "nothing"),
        },
    )


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def name_gate(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """The name gate (protocol 4.2): for every tokenizer of the study (the tested, base, judge
    and scorer checkpoints of every registered family; the demonstration family is a study of
    its own), is each registered name ONE token in every form in which it occurs in the
    documents (mid-sentence, at a line start, at a message start)? The first five names
    passing everywhere are selected, the same for every family of the study; with fewer, the
    first five in registered order stand in and the failure is flagged on everything
    downstream. Uses the real registered tokenizers (scripts/fetch_tokenizers.py), no weights."""
    step = name_gate_step(protocol.view(context.partition_key), Path(protocol.cache_dir))
    table, result = step.table, step.gate
    return dg.Output(table, metadata=named_metadata(context, {
        "selected names": ", ".join(result.selected),
        "families sharing this selection (4.2)": ", ".join(step.families),
        "outcome": passed_failed(result.passed),
        "verdict": result.message,
        "tokens per name (tokenizer, form)": md_table(step.tokens_per_name, index=True),
        "names x tokenizers x forms (SPLIT: more than one token)":
            md_table(report_plots.name_gate_table(table, step.names), index=True),
        "names x tokenizers x forms (plot)": metadata_image(
            report_plots.name_gate_plot(table, step.names), "name gate: names x tokenizers x forms"),
    }))


@dg.asset_check(asset=name_gate, blocking=True,
                description=GATE_DESCRIPTION + name_gate_description(DEFINITION_SETTINGS))
def five_single_token_names(context: dg.AssetCheckExecutionContext, protocol: ProtocolResource, name_gate: pd.DataFrame) -> dg.AssetCheckResult:
    verdict = name_gate_verdict(name_gate)
    return gate_result(
        context, name_gate, passed=verdict.passed, description=verdict.description,
        severity=gate_severity(protocol, context, name_gate),
        metadata={"which tokenizer splits which name": md_table(verdict.splits)},
    )


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"}, deps=["frame_bank"])
def name_candidates(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """Names for a registration amendment (protocol 4.2; DECISIONS 8): every candidate of the
    list shipped with the bank (data/bank/name_candidates.yaml), measured as the name gate
    measures the registered names (token count in every tokenizer of the study, in
    every form names occur in), and the first five passing everywhere, in the list's fixed
    alphabetical order, proposed. It never changes the registered names: applying a proposal
    is an explicit settings edit recorded as an amendment in the registration record."""
    bank = protocol.bank()
    result = name_candidates_step(Path(protocol.bank_dir), bank.canonical_text(),
                                  protocol.view(context.partition_key), Path(protocol.cache_dir))
    proposal = result.proposal
    return dg.Output(result.table, metadata=named_metadata(context, {
        "proposed (not applied)": ", ".join(proposal.proposed) or "none",
        "complete proposal": proposal.complete,
        "candidates passing everywhere":
            f"{len(proposal.passing)} of {len(result.candidates)}: {', '.join(proposal.passing)}",
        "verdict": result.message,
        "single-token candidates per tokenizer and form": md_table(
            single_token_counts(proposal.table), index=True),
    }))
