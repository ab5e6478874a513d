"""Surprisal matching and zero preference under the tested checkpoint (protocol 4.3)."""

import time

import dagster as dg
import pandas as pd

from fear_assets.defs.metadata import metadata_image
from fear_assets.defs.assets.steps import answer, candidates, tested_builder
from fear_assets.stimuli.name_gate import selected_names
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, family_partitions
from fear_assets.pilot.matching import (equivalence, event_differences, event_verdicts, final_bank_columns,
                                       frame_differences, frame_verdicts, matching_problems, read_tost,
                                       select_frames)
from fear_assets.pilot.questions import zero_preference_questions
from fear_assets.pilot.zero_preference import (within, zero_preference_failures, zero_preference_table,
                                               zero_preference_verdict)
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.report import plots as report_plots


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb", kinds={"duckdb", "python"})
def matched_frames(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   sentence_surprisal: pd.DataFrame, base_sentence_surprisal: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Surprisal matching (protocol 4.3) under this family's tested checkpoint: per frame the
    largest threat/harmless and agent-pair difference in mean non-name surprisal over the
    three rotations and both options ("retained within 0.10 nats/token"), the replacement
    of a failing confirmatory frame by its registered rewrite, else the lowest-numbered
    passing reserve of its fear, the drop rate by fear, and two one-sided tests that the
    retained bank's mean differences lie within +-0.05 (here on this stage's selection; the
    registration record re-runs the TOST and the event matching on the final selection, after
    binding replacement, from the per-frame columns stored here). ``passes_base`` marks frames that
    also pass under the base checkpoint (the base-against-assistant comparison uses only those)."""
    settings, bank = protocol.settings(), protocol.bank()
    rule = settings.matching
    diffs = frame_differences(sentence_surprisal)
    verdicts = frame_verdicts(diffs, rule.max_abs_difference)
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    selection, shortfall = select_frames(verdicts, numbers, settings.confirmatory_frames_per_fear(context.partition_key),
                                         {r.rewrite_of: r.id for r in bank.rewrites})
    tost = equivalence(diffs, set(selection["item_id"]), rule.tost_bound)
    events = event_verdicts(event_differences(sentence_surprisal, set(selection["item_id"]),
                                              settings.bank.event_classes), rule.max_abs_difference)
    table = verdicts.merge(selection.rename(columns={"item_id": "selected"}), how="left",
                           left_on="item_id", right_on="selected", suffixes=("", "_sel"))
    table = table.assign(family=context.partition_key, selected=table["selected"].notna(),
                         replaces=table["replaces"].fillna(""),
                         frames_to_write=table["fear"].map(shortfall).fillna(0).astype(int),
                         tost=tost.to_json(orient="records"), event_matching=events.to_json(orient="records"),
                         # 4.3: what the registration record needs to re-run both tests on the final bank.
                         **final_bank_columns(list(table["item_id"]), diffs, sentence_surprisal,
                                              settings.bank.event_classes))
    table = table.drop(columns=["fear_sel"], errors="ignore")
    # 4.3: the base-against-assistant comparison uses frames passing under both checkpoints.
    if len(base_sentence_surprisal):
        base = frame_verdicts(frame_differences(base_sentence_surprisal), rule.max_abs_difference)
        table["passes_base"] = table["item_id"].map(base.set_index("item_id")["passes"]).fillna(False).astype(bool)
    else:
        table["passes_base"] = pd.NA
    both = table[table["passes"] & (table["passes_base"] == True)]["item_id"].tolist()  # noqa: E712 (NA-safe)
    confirmatory = verdicts[verdicts["frame_set"] == "confirmatory"]
    drop = confirmatory.groupby("fear")["passes"].apply(lambda s: 1 - s.mean()).round(3)
    return dg.Output(table, metadata={
        "matching differences per frame (plot)": metadata_image(
            report_plots.matching_plot(table, rule.max_abs_difference),
            "matching differences per frame against the tolerance"),
        "retained confirmatory frames": int(table["selected"].sum()),
        "frames passing under tested and base (base-vs-assistant comparison)":
            ", ".join(both) if len(base_sentence_surprisal) else "no base checkpoint",
        "frames to write": dg.MetadataValue.json(shortfall),
        "drop rate by fear": dg.MetadataValue.md(drop.to_frame("drop rate").to_markdown()),
        "TOST (+-bound) across the retained bank": dg.MetadataValue.md(tost.round(4).to_markdown(index=False)),
        "events matched to the agent frames (4.3)": dg.MetadataValue.md(
            events.round(4).to_markdown(index=False) if len(events) else "no events in this design"),
    })


@dg.asset_check(asset=matched_frames, blocking=GATES_BLOCK, description=(
    "Protocol 4.3: every fear keeps its registered number of confirmatory frames after "
    "matching and replacement, the retained bank's mean differences are equivalent to "
    "zero within +-0.05 (TOST over frames, alpha 0.05), and every secondary-class event lies "
    "within 0.10 of the agent frames' mean surprisal. Otherwise: how many frames to write per "
    "fear and which events to rewrite. The TOST and the events are read here on this stage's "
    "selection, as a warning; the registration record reads them on the final selection (after "
    "binding replacement), so only a fear short of frames stops what follows."))
def matching_gate(protocol: ProtocolResource, matched_frames: pd.DataFrame) -> dg.AssetCheckResult:
    problems = matching_problems(matched_frames, protocol.settings().matching.tost_alpha)
    short = bool((matched_frames["frames_to_write"] > 0).any())
    return dg.AssetCheckResult(
        passed=not problems,
        # 4.3: the bank-level tests bind on the final bank (the record's gate); here they warn.
        severity=dg.AssetCheckSeverity.ERROR if short else dg.AssetCheckSeverity.WARN,
        description="matching passes" if not problems else
        "; ".join(problems) + ". New frames go through the same matching before registration (4.3).",
        metadata={"TOST": dg.MetadataValue.md(read_tost(matched_frames).round(4).to_markdown(index=False)),
                  "what it means": "the agent sentences differ in surprisal beyond the registered tolerance, so a "
                                   "Delta difference could be a surprisal difference" if problems else "none",
                  "next step": "write the listed frames (or rewrite the listed events), then re-run "
                               "sentence_surprisal and matched_frames" if problems else "none"},
    )


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS)
def zero_preference(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                    language_model: LanguageModelResource, name_gate: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Zero preference (4.3): with no document, every forced-choice question (each agent
    question of every frame, rotation, agent and content, and each partner question) under
    the tested checkpoint. The option probability of content option 1 is averaged over the
    two listing orders, so a preference for a letter or position (which the counterbalanced
    listing and H5's criterion absorb) is not read as a preference for a content; it must
    lie within the registered band. Failing items are listed for rewriting."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    spec, builder = tested_builder(protocol, language_model, family_key, selected_names(name_gate))
    questions = zero_preference_questions(builder, [bank.item(i) for i in candidates(settings, bank, family_key)])
    started = time.perf_counter()
    lps = answer(language_model, spec, questions, ["A", "B"])
    context.log.info(f"zero preference: {len(questions)} questions in {time.perf_counter() - started:.1f} s")
    band = settings.zero_preference
    per_listing = zero_preference_table(
        questions.drop(columns=["prefix", "body"]).assign(logprob_a=[x[0] for x in lps], logprob_b=[x[1] for x in lps]),
        band.low, band.high)
    keys = ["item_id", "fear", "frame_set", "kind", "agent", "content", "rotation"]
    table = per_listing.groupby(keys, as_index=False, sort=False).agg(
        p_option1=("p_option1", "mean"), p_option1_listed_first=("p_first", "mean"))
    table["passes"] = within(table["p_option1"], band.low, band.high).astype(bool)
    passed, message = zero_preference_verdict(table, band.low, band.high)
    table = table.assign(family=family_key, gate_passed=passed, message=message)
    failures = zero_preference_failures(table)
    return dg.Output(table, metadata={
        "questions": len(per_listing), "items": int(table["item_id"].nunique()),
        "items failing": int(len(failures)), "verdict": message,
        "failing items": dg.MetadataValue.md(failures.round(3).to_markdown(index=False) if len(failures) else "none"),
        "mean P(first-listed letter) (position bias, not a gate)": float(per_listing["p_first"].mean().round(3)),
    })


@dg.asset_check(asset=zero_preference, blocking=GATES_BLOCK, description=(
    "Protocol 4.3 zero preference: with no document, every forced-choice question's option "
    "probabilities lie within the registered band (0.4-0.6), for agent sentences and partners."))
def zero_preference_gate(zero_preference: pd.DataFrame) -> dg.AssetCheckResult:
    failures = zero_preference_failures(zero_preference)
    passed = bool(zero_preference["gate_passed"].iloc[0])
    return dg.AssetCheckResult(
        passed=passed, description=str(zero_preference["message"].iloc[0]),
        metadata={"failing items": dg.MetadataValue.md(failures.round(3).to_markdown(index=False) if len(failures) else "none"),
                  "questions": len(zero_preference),
                  "next step": "none" if passed else "rewrite the failing items' options (4.3) and re-run zero_preference"})
