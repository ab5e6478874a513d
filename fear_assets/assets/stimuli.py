"""Stage "stimuli" (protocol 4.2-4.3, Appendix A): the frozen frame bank."""


import json

import dagster as dg
import pandas as pd

from fear_assets.registration.freeze import compare_with_record, read_record
from fear_assets.resources.protocol import ProtocolResource
from fear_assets.errors import FreezeError

GROUP = "stimuli"


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


@dg.asset(group_name=GROUP, pool="duckdb", kinds={"duckdb", "python"})
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
