"""Stage "pilot" (protocol 5, 6.3): depth band and H5 depth from pilot frames only."""

import json
import time

import dagster as dg

from fear_assets.report import plots as report_plots  # issue 15: gate figures as metadata
import pandas as pd

from fear_assets.analysis.data import kept
from fear_assets.deploy import GPU_OP_TAGS
from fear_assets.modes import GATES_BLOCK
from fear_assets.pilot.binding import binding_verdicts, in_context_rate, single_sentence_checks
from fear_assets.pilot.questions import binding_questions, scorer_rows, user_chat, zero_preference_questions
from fear_assets.pilot.report_scoring import agreement, kappa_verdict, score_reports, scorer_prompt, scorer_says_yes
from fear_assets.pilot.zero_preference import (within, zero_preference_failures, zero_preference_table,
                                               zero_preference_verdict)
from fear_assets.resources.models import LanguageModelResource

from fear_assets.partitions import FAMILY_EXPR, all_depths_of_family, family_partitions
from fear_assets.lm.name_gate import selected_names
from fear_assets.pilot.depth_rules import depth_band, h5_depth, neutral_mention_rates
from fear_assets.pilot.matching import (equivalence, event_differences, event_verdicts, frame_differences, frame_verdicts,
                                       matching_problems, read_tost, select_frames)
from fear_assets.pilot.report_rule import mentions, partner_keywords
from fear_assets.resources.protocol import ProtocolResource

GROUP = "pilot"


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"}, ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family)})
def pilot_depths(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                 scores: pd.DataFrame, report_scoring: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Depth band (H1-H4) and H5 depth, named as depth indices (protocol 5), from pilot
    frames only and pooled over all six cells (no agent-by-content contrast is read): the
    band is the depths at which the generated report mentions the neutral partner on 20-80%
    of trials (else the two closest to 50%); the H5 depth is the deepest depth with pooled
    forced-choice accuracy in 0.60-0.90 (else the one closest to 0.75). A mention is the
    resolved outcome of 4.5 (``report_scoring``: keyword rule, blinded scorer, stem pass on
    disagreement); refusals are their own category and do not enter the rate."""
    settings = protocol.settings()
    # 4.8: excluded trials (document over the window, truncated answer) enter no rule.
    pilot = kept(scores[scores["block"] == "pilot_primary"]).copy()
    if pilot.empty:
        raise ValueError("no pilot_primary scores for this family: materialise scores for its depth partitions first")
    pilot["depth_index"] = pilot["depth"].str[1:].astype(int)
    accuracy = pilot.groupby("depth_index").agg(trials=("trial_id", "size"), fc_accuracy=("fc_correct", "mean"))
    by_depth = accuracy.reset_index().merge(neutral_mention_rates(report_scoring), on="depth_index", how="left")
    rule, h5 = settings.section("depth_band"), settings.section("h5_depth")
    band, band_rule = depth_band(dict(zip(by_depth.depth_index, by_depth.neutral_mention_rate)),
                                 rule["neutral_mention_low"], rule["neutral_mention_high"], int(rule["min_depths"]),
                                 rule["fallback_target"])
    h5_index, h5_rule = h5_depth(dict(zip(by_depth.depth_index, by_depth.fc_accuracy.astype(float))),
                                 h5["accuracy_low"], h5["accuracy_high"], h5["fallback_target"])
    family = settings.family(context.partition_key)
    table = by_depth.assign(
        family=context.partition_key, depth=[f"d{d}" for d in by_depth.depth_index],
        depth_tokens=[family.tokens_at(int(d)) for d in by_depth.depth_index],
        in_band=by_depth.depth_index.isin(band), is_h5_depth=by_depth.depth_index == h5_index,
        depth_band=",".join(map(str, band)), h5_depth=h5_index, band_rule=band_rule, h5_rule=h5_rule)
    return dg.Output(table, metadata={
        "depth band": ", ".join(f"d{d}" for d in band), "band rule": band_rule,
        "H5 depth": f"d{h5_index}", "H5 rule": h5_rule,
        "by depth": dg.MetadataValue.md(table[["depth", "depth_tokens", "trials", "answers", "refusals", "mentions",
                                               "neutral_mention_rate", "fc_accuracy", "in_band", "is_h5_depth"]].round(3).to_markdown(index=False)),
    })


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "python"})
def matched_frames(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   sentence_surprisal: pd.DataFrame, base_sentence_surprisal: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Surprisal matching (protocol 4.3) under this family's tested checkpoint: per frame the
    largest threat/harmless and agent-pair difference in mean non-name surprisal over the
    three rotations and both options (retained within 0.10 nats/token), the replacement of a
    failing confirmatory frame by its registered rewrite, else the lowest-numbered passing
    reserve of its fear, the drop rate by fear, and two one-sided tests that the retained
    bank's mean differences lie within +-0.05. Each family matches under its own tested
    checkpoint; ``passes_base`` marks frames that also pass under the base checkpoint (the
    base-against-assistant comparison uses only those)."""
    settings, bank = protocol.settings(), protocol.bank()
    family = settings.family(context.partition_key)
    rule = settings.section("matching")
    diffs = frame_differences(sentence_surprisal)
    verdicts = frame_verdicts(diffs, float(rule["max_abs_difference"]))
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    required = (family.reduced_design.confirmatory_frames_per_fear if family.reduced_design
                else int(settings.design["confirmatory_frames_required"]) // len(settings.fears))
    selection, shortfall = select_frames(verdicts, numbers, required, {r.rewrite_of: r.id for r in bank.rewrites})
    tost = equivalence(diffs, set(selection["item_id"]), float(rule["tost_bound"]))
    events = event_verdicts(event_differences(sentence_surprisal, set(selection["item_id"]),
                                              settings.bank_rules["event_classes"]), float(rule["max_abs_difference"]))
    table = verdicts.merge(selection.rename(columns={"item_id": "selected"}), how="left",
                           left_on="item_id", right_on="selected", suffixes=("", "_sel"))
    table = table.assign(family=context.partition_key, selected=table["selected"].notna(),
                         replaces=table["replaces"].fillna(""),
                         frames_to_write=table["fear"].map(shortfall).fillna(0).astype(int),
                         tost=tost.to_json(orient="records"), event_matching=events.to_json(orient="records"))
    table = table.drop(columns=["fear_sel"], errors="ignore")
    # 4.3: the base-against-assistant comparison uses frames passing under both checkpoints.
    if len(base_sentence_surprisal):
        base = frame_verdicts(frame_differences(base_sentence_surprisal), float(rule["max_abs_difference"]))
        table["passes_base"] = table["item_id"].map(base.set_index("item_id")["passes"]).fillna(False).astype(bool)
    else:
        table["passes_base"] = pd.NA
    both = table[table["passes"] & (table["passes_base"] == True)]["item_id"].tolist()  # noqa: E712 (NA-safe)
    confirmatory = verdicts[verdicts["frame_set"] == "confirmatory"]
    drop = confirmatory.groupby("fear")["passes"].apply(lambda s: 1 - s.mean()).round(3)
    return dg.Output(table, metadata={
        "matching differences per frame (plot)": report_plots.metadata_image(report_plots.matching_plot(table, float(rule["max_abs_difference"])), "matching differences per frame against the tolerance"),  # issue 15
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
    "fear and which events to rewrite."))
def matching_gate(protocol: ProtocolResource, matched_frames: pd.DataFrame) -> dg.AssetCheckResult:
    problems = matching_problems(matched_frames, float(protocol.settings().section("matching")["tost_alpha"]))
    tost = read_tost(matched_frames)
    return dg.AssetCheckResult(
        passed=not problems,
        description="matching passes" if not problems else
        "; ".join(problems) + ". New frames go through the same matching before registration (4.3).",
        metadata={"TOST": dg.MetadataValue.md(tost.round(4).to_markdown(index=False))},
    )


# ---------------------------------------------------------------------------------------
# Document-free checks under the tested checkpoint: zero preference and binding (4.2, 4.3)
# ---------------------------------------------------------------------------------------
def _answer(language_model, spec, questions: pd.DataFrame, answers: list[str]) -> list[list[float]]:
    """Log-probabilities of each answer after each question, one prefill per shared prefix."""
    from fear_assets.lm.choices import choice_logprobs
    from fear_assets.lm.engine import TeacherForcedEngine

    model, tokenizer = language_model.load(spec)
    engine = TeacherForcedEngine(model)
    out: list[list[float] | None] = [None] * len(questions)
    for prefix, part in questions.reset_index(drop=True).groupby("prefix", sort=False):
        for i, lps in zip(part.index, choice_logprobs(engine, tokenizer, prefix, list(part["body"]), answers)):
            out[i] = lps
    return out  # type: ignore[return-value]


def _builder(protocol, language_model, family_key: str, names: list[str]):
    from fear_assets.design.documents import DocumentBuilder
    from fear_assets.lm.models import registry

    settings, bank = protocol.settings(), protocol.bank()
    spec = registry(settings, family_key)["tested"]
    _, tokenizer = language_model.load(spec)
    return spec, DocumentBuilder(settings, bank, family_key, names, {"tested": tokenizer})


def _candidates(settings, bank, family_key: str):
    from fear_assets.design.trials import candidate_frames

    return candidate_frames(settings, bank, settings.family(family_key))


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS)
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
    names = selected_names(name_gate)
    spec, builder = _builder(protocol, language_model, family_key, names)
    questions = zero_preference_questions(builder, [bank.item(i) for i in _candidates(settings, bank, family_key)])
    started = time.perf_counter()
    lps = _answer(language_model, spec, questions, ["A", "B"])
    context.log.info(f"zero preference: {len(questions)} questions in {time.perf_counter() - started:.1f} s")
    band = settings.section("zero_preference")
    per_listing = zero_preference_table(
        questions.drop(columns=["prefix", "body"]).assign(logprob_a=[x[0] for x in lps], logprob_b=[x[1] for x in lps]),
        float(band["low"]), float(band["high"]))
    keys = ["item_id", "fear", "frame_set", "kind", "agent", "content", "rotation"]
    table = per_listing.groupby(keys, as_index=False, sort=False).agg(
        p_option1=("p_option1", "mean"), p_option1_listed_first=("p_first", "mean"))
    table["passes"] = within(table["p_option1"], float(band["low"]), float(band["high"])).astype(bool)
    passed, message = zero_preference_verdict(table, float(band["low"]), float(band["high"]))
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
                  "questions": len(zero_preference)})


def _pilot_unmasked(table: pd.DataFrame, key: pd.DataFrame) -> pd.DataFrame:
    """Conditions of pilot-frame rows only: the pilot gates (binding, controls) need them by
    construction, and no confirmatory row is ever unmasked here (D6)."""
    if not table["block"].str.startswith("pilot_").all():
        raise ValueError("pilot gates unmask pilot-frame rows only; confirmatory rows wait for the scoring lock")
    codes = key[["condition_code", "condition", "agent", "content", "cell_index"]].drop_duplicates()
    return table.merge(codes, on="condition_code", how="left", validate="many_to_one")


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS,
          ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
               "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)})
def binding_results(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                    language_model: LanguageModelResource, name_gate: pd.DataFrame, scores: pd.DataFrame,
                    assignment_key: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Binding (4.2). Single-sentence checks: each agent sentence alone after the system
    prompt, asked whether it refers to the model itself, the other assistant or the human
    manager, for every content, name and role (18 per frame); a frame failing any check is
    replaced like a matching failure. In-context checks: the 40 documents at the deepest
    depth built from the pilot frames (block pilot_binding_in_context); a pass rate below
    90% makes the configuration's self contrasts (H2-H5) uninterpretable, which is carried to
    the Section 8 reading."""
    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    rule = settings.section("binding")
    names = selected_names(name_gate)
    spec, builder = _builder(protocol, language_model, family_key, names)
    ids = _candidates(settings, bank, family_key)
    checks = single_sentence_checks(ids, settings.rotations, names[:3], expected=dict(rule["expected_letter"]),
                                    checks_per_frame=int(rule["single_sentence_checks_per_frame"]))
    questions = binding_questions(builder, checks)
    letters = sorted(set(rule["expected_letter"].values()))
    lps = _answer(language_model, spec, questions, letters)
    for j, letter in enumerate(letters):
        questions[f"logprob_{letter}"] = [x[j] for x in lps]
    questions["fear"] = [bank.item(i).group for i in questions["item_id"]]
    questions["frame_set"] = [bank.item(i).set for i in questions["item_id"]]
    verdicts = binding_verdicts(questions.drop(columns=["prefix", "body"]),
                                int(rule["single_sentence_checks_per_frame"]))
    # In-context documents (scored with the pilot): the expected letter is the agent's role.
    docs = scores[scores["block"] == "pilot_binding_in_context"]
    correct: list[bool] = []
    if len(docs):
        docs = _pilot_unmasked(docs, assignment_key)
        for r in docs.itertuples(index=False):
            lp = json.loads(r.choice_logprobs) if r.choice_logprobs else None
            chosen = "ABC"[max(range(3), key=lambda k: lp[k])] if lp and len(set(lp)) == 3 else ""
            correct.append(bool(not r.excluded_context and chosen == rule["expected_letter"][r.agent]))
    rate, in_context_passed, in_context_message = in_context_rate(correct, float(rule["pass_rate_min"])) \
        if correct else (float("nan"), False, "no in-context binding documents were scored: score block "
                         "pilot_binding_in_context at the deepest depth")
    numbers = {i: bank.item(i).number for i in verdicts["item_id"]}
    required = _required_per_fear(settings, family_key)
    selection, shortfall = select_frames(verdicts, numbers, required, {r.rewrite_of: r.id for r in bank.rewrites})
    table = verdicts.assign(family=family_key, in_context_documents=len(correct), in_context_correct=int(sum(correct)),
                            in_context_rate=rate, in_context_passed=in_context_passed,
                            in_context_message=in_context_message, frames_to_write=json.dumps(shortfall),
                            selected=verdicts["item_id"].isin(set(selection["item_id"])))
    failing = verdicts[~verdicts["passes"]]
    return dg.Output(table, metadata={
        "binding pass rates (plot)": report_plots.metadata_image(report_plots.binding_plot(table, float(rule["pass_rate_min"])), "binding pass rates"),  # issue 15
        "in-context pass rate": dg.MetadataValue.float(float(rate)) if correct else "not scored",
        "in-context": in_context_message,
        "frames failing a single-sentence check": int(len(failing)),
        "failing checks": dg.MetadataValue.md(failing[["item_id", "n_correct", "n_checks", "failed_checks"]]
                                              .to_markdown(index=False) if len(failing) else "none"),
    })


def _required_per_fear(settings, family_key: str) -> int:
    family = settings.family(family_key)
    return (family.reduced_design.confirmatory_frames_per_fear if family.reduced_design
            else int(settings.design["confirmatory_frames_required"]) // len(settings.fears))


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
                  "frames failing single-sentence checks": ", ".join(failing["item_id"]) or "none"})


# ---------------------------------------------------------------------------------------
# Generated-report scoring (4.5)
# ---------------------------------------------------------------------------------------
@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="gpu",
          kinds={"duckdb", "pytorch"}, op_tags=GPU_OP_TAGS,
          ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
               "trial_table": dg.AssetIn(partition_mapping=all_depths_of_family)})
def report_scoring(context: dg.AssetExecutionContext, protocol: ProtocolResource,
                   language_model: LanguageModelResource, scores: pd.DataFrame,
                   trial_table: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """Generated-report scoring of the pilot (4.5): whether each greedy answer mentions the
    agent item and the neutral item, by the frozen keyword rule and, independently, by the
    blinded scorer model registered for the family (it sees only the answer and the item's
    text); disagreements go to a third pass of the rule on word stems; refusals are their own
    category. Cohen's kappa between rule and scorer must reach the registered 0.80."""
    from fear_assets.lm.models import registry

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    rule_settings = settings.section("report_scoring")

    # 4.8: a truncated answer (or a document over the window) is an excluded trial.
    pilot = kept(scores)
    pilot = pilot[(pilot["block"] == "pilot_primary") & pilot["generated_text"].notna()]
    rows = scorer_rows(pilot, trial_table, bank, int(settings.design["neutral_partner_option"]), partner_keywords)
    if rows.empty:
        raise ValueError("no generated pilot answers: score the pilot_primary block (with its greedy answer) first")
    rows["rule"] = [mentions(t, k) for t, k in zip(rows["generated_text"], rows["keywords"])]
    spec = registry(settings, family_key)["scorer"]
    _, tokenizer = language_model.load(spec)
    prefix, suffix = user_chat(tokenizer)
    template = bank.templates["prompts"]["scorer"]
    questions = rows.assign(prefix=prefix, body=[scorer_prompt(template, a, i) + suffix
                                                 for a, i in zip(rows["generated_text"], rows["item_text"])])
    yes, no = rule_settings["scorer_letters"]
    started = time.perf_counter()
    lps = _answer(language_model, spec, questions, [yes, no])
    context.log.info(f"blinded scorer ({spec.checkpoint}): {len(rows)} judgements in "
                     f"{time.perf_counter() - started:.1f} s")
    rows["scorer"] = [scorer_says_yes(a, b) for a, b in lps]
    scored = score_reports(rows, list(rule_settings["refusal_phrases"]))
    answered = scored[~scored["refusal"]]
    kappa, detail = agreement(list(answered["rule"]), list(answered["scorer"]))
    passed, message = kappa_verdict(kappa, float(rule_settings["kappa_min"]), detail)
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


# ---------------------------------------------------------------------------------------
# Positive controls in the pilot (4.6, D4)
# ---------------------------------------------------------------------------------------
def _fitter(settings):
    from fear_assets.analysis.primary_model import Fitter, Priors

    sampler = settings.section("sampler")
    return Fitter(Priors.from_settings(settings), int(sampler["draws"]), int(sampler["tune"]), int(sampler["chains"]))


def _band(pilot_depths: pd.DataFrame) -> list[str]:
    return [f"d{b}" for b in str(pilot_depths["depth_band"].iloc[0]).split(",")]


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "pymc"},
          ins={"scores": dg.AssetIn(partition_mapping=all_depths_of_family),
               "pilot_control_scores": dg.AssetIn(partition_mapping=all_depths_of_family),
               "assignment_key": dg.AssetIn(partition_mapping=all_depths_of_family)})
def pilot_controls(context: dg.AssetExecutionContext, protocol: ProtocolResource, scores: pd.DataFrame,
                   pilot_control_scores: pd.DataFrame, assignment_key: pd.DataFrame,
                   sentence_surprisal: pd.DataFrame, judge_sentence_surprisal: pd.DataFrame,
                   pilot_depths: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The four positive controls on the pilot frames (4.6, D4), each contrast signed so the
    predicted direction is positive and averaged over the depth band: the primary model is
    fitted once on the control cells together with the matched primary cells
    (pilot_primary), with a condition factor and its interactions and shared frame effects,
    and the contrast is read from that posterior (the addressee control, whose contrast lies
    within its own cells, is fitted on them). A control passes with posterior mean >= 0.15
    and its 99% HDI wholly above zero; a failing control may be strengthened once before
    registration. Also records gate (c)'s scale: the trial-level residual SD implied by the
    primary model fitted to the pilot over all pilot depths (Student-t scale and nu), for
    the tested model and, where scored, the judge (with its own surprisals)."""
    from fear_assets.analysis.controls import CONTROLS, control_verdict, fit_control
    from fear_assets.analysis.data import model_table
    from fear_assets.analysis.fits import fit_cells
    from fear_assets.analysis.primary_model import implied_residual_sd
    from fear_assets.hashing import derived_seed

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    rule = settings.section("positive_controls")
    band = _band(pilot_depths)
    fears_of = {i: bank.item(i).group for i in set(scores["item_id"]) | set(pilot_control_scores["item_id"])}
    neutral = int(settings.design["neutral_partner_option"])
    every = pd.concat([scores, pilot_control_scores], ignore_index=True)

    def table(block: str, depths=None, surprisal: pd.DataFrame = sentence_surprisal) -> pd.DataFrame:
        rows = every[(every["block"] == block) & (every["depth"].isin(band if depths is None else depths))]
        return model_table(_pilot_unmasked(rows, assignment_key), surprisal, fears_of, neutral) \
            if len(rows) else rows

    fitter = _fitter(settings)
    seed = lambda name: derived_seed(settings.master_seed, "pilot_controls", family_key, name) % (2**31)
    all_depths = sorted(set(every.loc[every["block"] == "pilot_primary", "depth"]), key=lambda k: int(k[1:]))
    # Gate (c)'s sigma: the primary model on the pilot over all pilot depths (6.2).
    primary_all = fit_cells(fitter, table("pilot_primary", all_depths), settings.fears, band, seed("primary"),
                            "pilot_primary")
    primary = table("pilot_primary")
    rows = []
    for name, suffix in CONTROLS.items():
        data = table(f"pilot_{suffix}")
        if data.empty:
            rows.append({"control": name, "mean": float("nan"), "hdi_low": float("nan"), "hdi_high": float("nan"),
                         "passed": False, "reason": f"not scored: block pilot_{suffix} has no rows at the band depths"})
            continue
        fit = fit_control(fitter, name, data, primary, settings.fears, band, seed(name))
        verdict = control_verdict(name, fit.draws, settings.decision["hdi_prob"],
                                  float(rule["pass_min_mean"]), float(rule["hdi_above"]))
        rows.append({**verdict.__dict__, "trials": fit.rows, "max_rhat": fit.diagnostics["max_rhat"],
                     "divergences": fit.diagnostics["divergences"]})
        context.log.info(f"control {name}: mean {verdict.mean:.3f}, HDI [{verdict.hdi_low:.3f}, "
                         f"{verdict.hdi_high:.3f}] -> {'pass' if verdict.passed else 'FAIL'}")
    # Gate (c) standardises each reader by its own pilot residual SD: the judge's, where scored
    # (its covariates from its own surprisals).
    judge_sigma = float("nan")
    if len(judge_sentence_surprisal):
        judge = table("pilot_judge", all_depths, judge_sentence_surprisal)
        if len(judge):
            judge_sigma = implied_residual_sd(fit_cells(fitter, judge, settings.fears, band, seed("judge"),
                                                        "pilot_judge").idata)
    sigma = implied_residual_sd(primary_all.idata)
    result = pd.DataFrame(rows).assign(family=family_key, band_depths=",".join(band), pilot_sigma=sigma,
                                       pilot_sigma_judge=judge_sigma, pilot_sigma_depths=",".join(all_depths),
                                       compilations=fitter.compilations)
    return dg.Output(result, metadata={
        "controls": dg.MetadataValue.md(result[["control", "mean", "hdi_low", "hdi_high", "passed", "reason"]]
                                        .round(3).to_markdown(index=False)),
        "pilot sigma (gate (c) scale; SD implied by the Student-t fit, all pilot depths)": round(sigma, 4),
        "model compilations": fitter.compilations,
    })


@dg.asset_check(asset=pilot_controls, blocking=GATES_BLOCK, description=(
    "Protocol 4.6 / D4: every positive control passes in the pilot (posterior mean >= 0.15 "
    "and 99% HDI wholly above zero). A failing control's manipulation may be strengthened "
    "once before registration."))
def positive_controls_pass(pilot_controls: pd.DataFrame) -> dg.AssetCheckResult:
    bad = pilot_controls[~pilot_controls["passed"].astype(bool)]
    return dg.AssetCheckResult(
        passed=bad.empty,
        description="all four controls pass" if bad.empty else
        "failing: " + "; ".join(f"{r.control} ({r.reason})" for r in bad.itertuples()) +
        ". Strengthen the failing manipulation once before registration (4.6); if a control fails in "
        "confirmatory data no Section 8 reading is made.",
        metadata={"controls": dg.MetadataValue.md(pilot_controls[["control", "mean", "hdi_low", "hdi_high", "passed"]]
                                                  .round(3).to_markdown(index=False))})


# ---------------------------------------------------------------------------------------
# The registration record (Appendix C step 4, D6)
# ---------------------------------------------------------------------------------------
def _final_selection(settings, bank, family_key, matched, binding, zero) -> tuple[list[str], dict, dict]:
    """Confirmatory frames after every pilot gate: a frame is kept if it passes matching,
    the single-sentence binding checks and zero preference; else replaced (4.3)."""
    z = zero.groupby("item_id")["passes"].all()
    b = binding.set_index("item_id")["passes"]
    v = matched[["item_id", "fear", "frame_set", "passes"]].copy()
    v["passes"] = v["passes"] & v["item_id"].map(b).fillna(False) & v["item_id"].map(z).fillna(False)
    selection, shortfall = select_frames(v, {i: bank.item(i).number for i in v["item_id"]},
                                         _required_per_fear(settings, family_key),
                                         {r.rewrite_of: r.id for r in bank.rewrites})
    replacements = {r.replaces: r.item_id for r in selection.itertuples() if r.replaces}
    return list(selection["item_id"]), replacements, shortfall


@dg.asset(group_name=GROUP, partitions_def=family_partitions, metadata=FAMILY_EXPR, pool="duckdb",
          kinds={"duckdb", "json"}, deps=[dg.AssetKey("power_summary")])  # 6.3 before registration
def registration_record(context: dg.AssetExecutionContext, protocol: ProtocolResource, name_gate: pd.DataFrame,
                        model_manifest: pd.DataFrame, matched_frames: pd.DataFrame, zero_preference: pd.DataFrame,
                        binding_results: pd.DataFrame, report_scoring: pd.DataFrame, pilot_depths: pd.DataFrame,
                        pilot_controls: pd.DataFrame, probe_controls: pd.DataFrame) -> dg.Output[pd.DataFrame]:
    """The Stage 1 registration record of one configuration: frozen hashes (bank, settings,
    model manifest, analysis code), selected names and frames, depth band and H5 depth, the
    pilot sigma for gate (c), every gate's outcome with its numbers, what is carried to the
    reading (in-context binding, the power result) and the stated deviations. Written as JSON
    and Markdown under data/registration/<family>/ (a draft in pilot mode; in confirmatory
    mode registered only when every gate passes, the power gate included, else refused);
    from then on the freeze check compares every run with it."""
    from fear_assets.lm.models import manifest_digest
    from fear_assets.registration.gates import (binding_outcomes, deviations, power_gate, registered_power_result,
                                                registration_status)
    from fear_assets.registration.record import analysis_code_sha256, read_power_section, write_family_record

    settings, bank = protocol.settings(), protocol.bank()
    family_key = context.partition_key
    family = settings.family(family_key)
    frames, replacements, shortfall = _final_selection(settings, bank, family_key, matched_frames,
                                                       binding_results, zero_preference)
    tost = read_tost(matched_frames)
    alpha = float(settings.section("matching")["tost_alpha"])
    matching = matching_problems(matched_frames, alpha)
    b0, r0, p0 = binding_results.iloc[0], report_scoring.iloc[0], pilot_depths.iloc[0]
    # 4.2 / D5 row 2: the in-context rate is carried to the reading; the frame shortfall is a gate.
    binding_gate_entry, binding_in_context = binding_outcomes(
        bool(b0["in_context_passed"]), int(b0["in_context_correct"]), int(b0["in_context_documents"]),
        str(b0["in_context_message"]), int((~binding_results["passes"]).sum()), json.loads(b0["frames_to_write"]))
    # 6.3: the stored power result, written by power_summary (None until it has run).
    power = read_power_section(protocol.registration_dir, family_key)
    ctrl = probe_controls[probe_controls["frame_set"] == "pilot"]
    gates = {
        "name_gate (4.2)": {"passed": bool(name_gate["gate_passed"].iloc[0]),
                            "numbers": {"selected": ", ".join(selected_names(name_gate))},
                            "message": "five registered names single-token in every tokenizer" if bool(name_gate["gate_passed"].iloc[0])
                            else "fewer than five names are single tokens everywhere; the registered-order names stand in"},
        "matching (4.3)": {"passed": not matching,
                           "numbers": {"frames passing": int(matched_frames["passes"].sum()),
                                       "frames examined": len(matched_frames),
                                       "events failing": sum(not e["passes"] for e in json.loads(matched_frames["event_matching"].iloc[0])),
                                       "max TOST p": round(float(tost["tost_p"].max()), 4) if len(tost) else "n/a"},
                           "message": "; ".join(matching) or "matching passes (frames to write: none)"},
        "zero_preference (4.3)": {"passed": bool(zero_preference["gate_passed"].iloc[0]),
                                  "numbers": {"items failing": int(zero_preference.loc[~zero_preference["passes"], "item_id"].nunique())},
                                  "message": str(zero_preference["message"].iloc[0])},
        "binding single-sentence (4.2)": binding_gate_entry,
        "scorer_agreement (4.5)": {"passed": bool(r0["gate_passed"]),
                                   "numbers": {"kappa": None if pd.isna(r0["kappa"]) else round(float(r0["kappa"]), 3)},
                                   "message": str(r0["message"])},
        "probe rules (6.1)": {"passed": bool(ctrl["h4_interpretable"].iloc[0]) and not bool(ctrl["h4_estimation_only"].fillna(False).iloc[0]) if len(ctrl) else False,
                              "numbers": {"interpretable": bool(ctrl["h4_interpretable"].iloc[0]) if len(ctrl) else "n/a",
                                          "estimation-only (ceiling)": bool(ctrl["h4_estimation_only"].fillna(False).iloc[0]) if len(ctrl) else "n/a"},
                              "message": "H4 is declared estimation-only before collection" if len(ctrl) and bool(ctrl["h4_estimation_only"].fillna(False).iloc[0])
                              else "control probes at chance, no ceiling" if len(ctrl) else "no pilot probe outputs"},
        "positive_controls (4.6)": {"passed": bool(pilot_controls["passed"].all()),
                                    "numbers": {r.control: f"{r.mean:.3f} [{r.hdi_low:.3f}, {r.hdi_high:.3f}]"
                                                for r in pilot_controls.itertuples()},
                                    "message": "; ".join(f"{r.control}: {r.reason}" for r in pilot_controls.itertuples())},
        "frame_selection (4.3)": {"passed": not shortfall, "numbers": {"confirmatory frames": len(frames)},
                                  "message": "every fear has its frames" if not shortfall else
                                  "write " + ", ".join(f"{n} frame(s) for {f}" for f, n in shortfall.items())},
        "power (6.3)": power_gate(power, family_key),
    }
    confirmatory = settings.mode == "confirmatory"
    failed_gates = [n for n, g in gates.items() if not g["passed"]]
    zero_band = settings.section("zero_preference")
    record = {
        "protocol": settings.raw["protocol"]["name"], "protocol_version": settings.raw["protocol"]["version"],
        "family": family_key, "mode": settings.mode, "status": registration_status(settings.mode, failed_gates),
        "stand_in": family.stand_in or "", "reduced_design": family.reduced_design.reason if family.reduced_design else "",
        "settings_sha256": settings.sha256, "bank_sha256": bank.sha256,
        "manifest_sha256": manifest_digest(model_manifest), "analysis_code_sha256": analysis_code_sha256(),
        "selected_names": selected_names(name_gate), "selected_frames": frames,
        "replacements": replacements, "depth_band": [int(x) for x in str(p0["depth_band"]).split(",")],
        "band_rule": str(p0["band_rule"]), "h5_depth": int(p0["h5_depth"]), "h5_rule": str(p0["h5_rule"]),
        "pilot_sigma": round(float(pilot_controls["pilot_sigma"].iloc[0]), 6),
        "pilot_sigma_judge": (None if pd.isna(pilot_controls["pilot_sigma_judge"].iloc[0])
                              else round(float(pilot_controls["pilot_sigma_judge"].iloc[0]), 6)),
        "gates": gates, "failed_gates": failed_gates, "binding_in_context": binding_in_context, "power": power,
        "not_run": [] if registered_power_result(power) else
                   ["power simulation (6.3, Appendix C step 3): no registered power result (none stored, "
                    "a reduced demo, or incomplete)"],
        "deviations": deviations(float(zero_band["low"]), float(zero_band["high"])),
    }
    path = write_family_record(protocol.registration_dir, record, confirmatory)
    table = pd.DataFrame([{"family": family_key, "gate": n, "passed": g["passed"], "numbers": json.dumps(g["numbers"]),
                           "message": g["message"]} for n, g in gates.items()])
    table = table.assign(record_json=json.dumps(record, sort_keys=True), record_path=str(path))
    context.log.info(f"registration record ({record['status']}) written to {path}; failed gates: "
                     f"{', '.join(record['failed_gates']) or 'none'}")
    return dg.Output(table, metadata={
        "record": str(path), "status": record["status"],
        "failed gates": ", ".join(record["failed_gates"]) or "none",
        "gates": dg.MetadataValue.md(table[["gate", "passed", "numbers", "message"]].to_markdown(index=False)),
        "depth band": ", ".join(f"d{d}" for d in record["depth_band"]), "H5 depth": f"d{record['h5_depth']}",
    })


@dg.asset_check(asset=registration_record, blocking=GATES_BLOCK, description=(
    "Every registration gate of the pilot passes (the record lists each with its numbers). "
    "Blocking in confirmatory mode; in pilot mode the failures travel with the analysis."))
def registration_gates(registration_record: pd.DataFrame) -> dg.AssetCheckResult:
    failed = registration_record[~registration_record["passed"].astype(bool)]
    return dg.AssetCheckResult(
        passed=failed.empty,
        description="every gate passes" if failed.empty else "failed: " + "; ".join(
            f"{r.gate}: {r.message}" for r in failed.itertuples()),
        metadata={"gates": dg.MetadataValue.md(registration_record[["gate", "passed", "numbers"]].to_markdown(index=False))})
