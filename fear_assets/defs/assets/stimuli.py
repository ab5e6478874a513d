"""Stage "stimuli" (protocol 4.2-4.3, Appendix A): the frozen frame bank and the names."""

import json
from pathlib import Path

import dagster as dg
import pandas as pd

from fear_assets.defs.metadata import metadata_image
from fear_assets.core.errors import FreezeError
from fear_assets.stimuli.name_candidates import load_candidates, proposal_message, propose_names, single_token_counts
from fear_assets.stimuli.name_gate import run_name_gate, selected_names, study_families, study_tokenizers
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.registration.freeze import compare_with_record, read_record
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.report import plots as report_plots




def bank_table(bank, settings) -> pd.DataFrame:
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


def _appendix_a(bank, settings) -> str:
    """One canonical frame per fear (the protocol's Table A1), rendered for reading."""
    lines = ["| fear | frame | threat (assistant) | harmless (assistant) | human verbs | options |",
             "|---|---|---|---|---|---|"]
    for fear in settings.fears:
        frame = bank.frames_of(fear, "pilot")[0]
        a, p = frame.verbs["assistant"], frame.verbs["person"]
        lines.append(f"| {fear} | {frame.id} | {frame.sentence.format(agent='[Agent]', verb=a['threat'], content='[option]')} "
                     f"| {a['harmless']} | {p['threat']} / {p['harmless']} | {' / '.join(frame.content_options)} |")
    return "\n".join(lines)


@dg.asset(pool="duckdb", kinds={"duckdb", "python"})
def frame_bank(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """The stimulus bank (protocol 4.3): 80 agent frames (16 per fear: 2 pilot, 10
    confirmatory, 4 reserve), 20 generic aversive and 20 surprise-only events, each with
    its neutral partner, validated once at load. Its data version is the canonical sha256
    of the bank, so anything built from another bank is visibly stale."""
    settings = protocol.settings()
    bank = protocol.bank()
    table = bank_table(bank, settings)
    counts = table.groupby(["kind", "fear", "frame_set"]).size().reset_index(name="items")
    context.log.info(f"bank {bank.sha256[:12]}: {len(bank.frames)} frames, {len(bank.events)} events")
    return dg.Output(
        table,
        data_version=dg.DataVersion(bank.sha256),
        metadata={
            "bank_sha256": bank.sha256,
            "settings_sha256": settings.sha256,
            "frames": len(bank.frames),
            "events": len(bank.events),
            "items by fear and set": dg.MetadataValue.md(counts.to_markdown(index=False)),
            "canonical frames (Appendix A)": dg.MetadataValue.md(_appendix_a(bank, settings)),
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
    settings = protocol.settings()
    result = run_name_gate(settings, context.partition_key, Path(protocol.cache_dir))
    table = result.table.assign(family=context.partition_key, selected_names=json.dumps(result.selected),
                                gate_passed=result.passed)
    pivot = table.pivot_table(index="name", columns=["tokenizer", "form"], values="n_tokens", aggfunc="max")
    pivot = pivot.reindex(settings.names)
    return dg.Output(table, metadata={
        "selected names": ", ".join(result.selected),
        "families sharing this selection (4.2)": ", ".join(study_families(settings, context.partition_key)),
        "passed": result.passed,
        "verdict": result.message,
        "tokens per name (tokenizer, form)": dg.MetadataValue.md(pivot.to_markdown()),
        "names x tokenizers x forms (SPLIT: more than one token)":
            dg.MetadataValue.md(report_plots.name_gate_table(table, settings.names).to_markdown()),
        "names x tokenizers x forms (plot)": metadata_image(
            report_plots.name_gate_plot(table, settings.names), "name gate: names x tokenizers x forms"),
    })


@dg.asset_check(asset=name_gate, blocking=GATES_BLOCK, description=(
    "Protocol 4.2 name gate: at least five registered names are single tokens in every form "
    "in every tokenizer of the study (tested, base, judge and scorer of every registered family). "
    "Blocking in confirmatory mode."))
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


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"}, deps=["frame_bank"])
def name_candidates(context: dg.AssetExecutionContext, protocol: ProtocolResource) -> dg.Output[pd.DataFrame]:
    """Names for a registration amendment (protocol 4.2; DECISIONS 8): every candidate of the
    list shipped with the bank (data/bank/name_candidates.yaml), measured as the name gate
    measures the registered names (token count in every tokenizer of the study, in
    every form names occur in), and the first five passing everywhere, in the list's fixed
    alphabetical order, proposed. It never changes the registered names: applying a proposal
    is an explicit settings edit recorded as an amendment in the registration record."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    candidates = load_candidates(Path(protocol.bank_dir), settings.names, bank.canonical_text())
    k = settings.selected_name_count
    proposal = propose_names(candidates, study_tokenizers(settings, family_key, Path(protocol.cache_dir)), k)
    table = proposal.table.assign(family=family_key, tokens=proposal.table["tokens"].map(" ".join))
    return dg.Output(table, metadata={
        "proposed (not applied)": ", ".join(proposal.proposed) or "none",
        "complete proposal": proposal.complete,
        "candidates passing everywhere": f"{len(proposal.passing)} of {len(candidates)}: {', '.join(proposal.passing)}",
        "verdict": proposal_message(family_key, proposal, len(candidates), k),
        "single-token candidates per tokenizer and form": dg.MetadataValue.md(
            single_token_counts(proposal.table).to_markdown()),
    })
