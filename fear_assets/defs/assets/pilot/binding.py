"""Binding (protocol 4.2) and generated-report scoring (4.5) of the pilot."""

import json
import time

import dagster as dg
import pandas as pd

from fear_assets.defs.metadata import metadata_image
from fear_assets.models.data import kept
from fear_assets.analysis.unmasking import unmask_pilot
from fear_assets.defs.assets.steps import answer, candidates, tested_builder
from fear_assets.defs.deploy import GPU_OP_TAGS
from fear_assets.lm.models import registry
from fear_assets.stimuli.name_gate import selected_names
from fear_assets.defs.modes import GATES_BLOCK
from fear_assets.defs.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.pilot.binding import binding_verdicts, in_context_correct, in_context_rate, single_sentence_checks
from fear_assets.pilot.matching import select_frames
from fear_assets.pilot.questions import binding_questions, scorer_rows, user_chat
from fear_assets.pilot.report_rule import mentions, partner_keywords
from fear_assets.pilot.report_scoring import agreement, kappa_verdict, score_reports, scorer_prompt, scorer_says_yes
from fear_assets.defs.resources.models import LanguageModelResource
from fear_assets.defs.resources.protocol import ProtocolResource
from fear_assets.report import plots as report_plots

BY_DEPTH = dg.AssetIn(partition_mapping=all_depths_of_family)


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS, ins={"pilot_scores": BY_DEPTH, "assignment_key": BY_DEPTH})
def binding_results(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                    language_model: LanguageModelResource, name_gate: pd.DataFrame, pilot_scores: pd.DataFrame,
                    assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Binding (4.2). Single-sentence checks: "each agent sentence alone after the system
    prompt, asked whether it refers to the model itself, the other assistant or the human
    manager", for every content, name and role (18 per frame); a frame failing any check is
    replaced like a matching failure. In-context checks: the 40 documents at the deepest
    depth built from the pilot frames (block pilot_binding_in_context); "a pass rate below
    90% makes the configuration's self contrasts (H2-H5) uninterpretable", which is carried
    to the Section 8 reading."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    rule = settings.binding
    names = selected_names(name_gate)
    spec, builder = tested_builder(protocol, language_model, family_key, names)
    checks = single_sentence_checks(candidates(settings, bank, family_key), settings.rotations, names[:3],
                                    expected=dict(rule.expected_letter),
                                    checks_per_frame=rule.single_sentence_checks_per_frame)
    questions = binding_questions(builder, checks)
    letters = sorted(set(rule.expected_letter.values()))
    lps = answer(language_model, spec, questions, letters)
    for j, letter in enumerate(letters):
        questions[f"logprob_{letter}"] = [x[j] for x in lps]
    questions["fear"] = [bank.item(i).group for i in questions["item_id"]]
    questions["frame_set"] = [bank.item(i).set for i in questions["item_id"]]
    verdicts = binding_verdicts(questions.drop(columns=["prefix", "body"]), rule.single_sentence_checks_per_frame)
    docs = pilot_scores[pilot_scores["block"] == "pilot_binding_in_context"]
    correct = in_context_correct(unmask_pilot(docs, assignment_key), rule.expected_letter) if len(docs) else []
    rate, in_context_passed, in_context_message = in_context_rate(correct, rule.pass_rate_min) \
        if correct else (float("nan"), False, "no in-context binding documents were scored: score block "
                         "pilot_binding_in_context at the deepest depth")
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    selection, shortfall = select_frames(verdicts, numbers, settings.confirmatory_frames_per_fear(family_key),
                                         {r.rewrite_of: r.id for r in bank.rewrites})
    table = verdicts.assign(family=family_key, in_context_documents=len(correct), in_context_correct=int(sum(correct)),
                            in_context_rate=rate, in_context_passed=in_context_passed,
                            in_context_message=in_context_message, frames_to_write=json.dumps(shortfall),
                            selected=verdicts["item_id"].isin(set(selection["item_id"])))
    failing = verdicts[~verdicts["passes"]]
    return dg.Output(table, metadata={
        "binding pass rates (plot)": metadata_image(report_plots.binding_plot(table, rule.pass_rate_min),
                                                                 "binding pass rates"),
        "in-context pass rate": dg.MetadataValue.float(float(rate)) if correct else "not scored",
        "in-context": in_context_message,
        "frames failing a single-sentence check": int(len(failing)),
        "failing checks": dg.MetadataValue.md(failing[["item_id", "n_correct", "n_checks", "failed_checks"]]
                                              .to_markdown(index=False) if len(failing) else "none"),
    })


@dg.asset_check(asset=binding_results, blocking=GATES_BLOCK, description=(
    "Protocol 4.2 binding: every fear keeps its confirmatory frames after replacing frames "
    "that fail a single-sentence check (blocks registration otherwise); the in-context pass "
    "rate >= 90% (below it H2-H5 are uninterpretable: a warning carried to the Section 8 "
    "reading as D5 row 2, not a stop)."))
def binding_gate(binding_results: pd.DataFrame) -> dg.AssetCheckResult:
    first = binding_results.iloc[0]
    shortfall = json.loads(first["frames_to_write"])
    problems = []
    if not bool(first["in_context_passed"]):
        problems.append(str(first["in_context_message"]))
    if shortfall:
        problems.append("after replacing frames that fail a single-sentence check, write "
                        + ", ".join(f"{n} frame(s) for {f}" for f, n in shortfall.items()))
    failing = binding_results[~binding_results["passes"]]
    return dg.AssetCheckResult(
        passed=not problems,
        # Only the frame shortfall stops registration; the in-context rate is read (D5 row 2).
        severity=dg.AssetCheckSeverity.ERROR if shortfall else dg.AssetCheckSeverity.WARN,
        description="binding passes: in-context rate "
                    f"{first['in_context_correct']}/{first['in_context_documents']}" if not problems else " | ".join(problems),
        metadata={"in-context": f"{first['in_context_correct']}/{first['in_context_documents']}",
                  "frames failing single-sentence checks": ", ".join(failing["item_id"]) or "none",
                  "next step": "none" if not problems else
                  "replace the failing frames (write new ones for the fears listed); a low in-context rate is read "
                  "as D5 row 2 (H2-H5 uninterpretable), no frame change fixes it"})


@dg.asset(partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu", kinds={"duckdb", "pytorch"},
          op_tags=GPU_OP_TAGS, ins={"pilot_scores": BY_DEPTH, "pilot_trial_table": BY_DEPTH})
def report_scoring(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   language_model: LanguageModelResource, pilot_scores: pd.DataFrame,
                   pilot_trial_table: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Generated-report scoring of the pilot (4.5): whether each greedy answer mentions the
    agent item and the neutral item, "by the frozen keyword rule and, independently, by the
    blinded scorer model" registered for the family (it sees only the answer and the item's
    text); disagreements go to a third pass of the rule on word stems; refusals are their own
    category. Cohen's kappa between rule and scorer must reach the registered 0.80."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    rule = settings.report_scoring
    # 4.8: a truncated answer (or a document over the window) is an excluded trial.
    pilot = kept(pilot_scores)
    pilot = pilot[(pilot["block"] == "pilot_primary") & pilot["generated_text"].notna()]
    rows = scorer_rows(pilot, pilot_trial_table, bank, settings.neutral_partner_option, partner_keywords)
    if rows.empty:
        raise ValueError("no generated pilot answers: score the pilot_primary block (with its greedy answer) first")
    rows["rule"] = [mentions(t, k) for t, k in zip(rows["generated_text"], rows["keywords"])]
    spec = registry(settings, family_key)["scorer"]
    _, tokenizer = language_model.load(spec)
    prefix, suffix = user_chat(tokenizer)
    template = bank.templates["prompts"]["scorer"]
    questions = rows.assign(prefix=prefix, body=[scorer_prompt(template, a, i) + suffix
                                                 for a, i in zip(rows["generated_text"], rows["item_text"])])
    yes, no = rule.scorer_letters
    started = time.perf_counter()
    lps = answer(language_model, spec, questions, [yes, no])
    context.log.info(f"blinded scorer ({spec.checkpoint}): {len(rows)} judgements in "
                     f"{time.perf_counter() - started:.1f} s")
    rows["scorer"] = [scorer_says_yes(a, b) for a, b in lps]
    scored = score_reports(rows, list(rule.refusal_phrases))
    answered = scored[~scored["refusal"]]
    kappa, detail = agreement(list(answered["rule"]), list(answered["scorer"]))
    passed, message = kappa_verdict(kappa, rule.kappa_min, detail)
    stand_in = settings.family(family_key).stand_in
    if stand_in:
        message += " (the scorer is the tested model itself, a stand-in: " + stand_in + ")"
    table = scored.assign(family=family_key, keywords=scored["keywords"].map(json.dumps),
                          kappa=float("nan") if kappa is None else kappa,
                          gate_passed=passed, message=message, scorer_checkpoint=spec.checkpoint)
    by = table.groupby(["side", "category"]).size().unstack(fill_value=0)
    return dg.Output(table, metadata={
        "kappa": dg.MetadataValue.float(float(kappa)) if kappa is not None else "undefined",
        "verdict": message, "answers": int(pilot.shape[0]),
        "categories by side": dg.MetadataValue.md(by.to_markdown()),
        "disagreements resolved by the stem pass": int(table["stem"].notna().sum()),
    })


@dg.asset_check(asset=report_scoring, blocking=GATES_BLOCK, description=(
    "Protocol 4.5: Cohen's kappa between the keyword rule and the blinded scorer >= 0.80 "
    "(else the rule is revised on pilot data before registration)."))
def scorer_agreement(report_scoring: pd.DataFrame) -> dg.AssetCheckResult:
    first = report_scoring.iloc[0]
    return dg.AssetCheckResult(passed=bool(first["gate_passed"]), description=str(first["message"]),
                               metadata={"kappa": str(first["kappa"]),
                                         "refusals": int(report_scoring["refusal"].sum())})
