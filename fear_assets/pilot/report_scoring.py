"""Scoring of the generated report (protocol 4.5).

The greedy answer is scored, separately for the agent item and the neutral partner, by the
frozen keyword rule (:mod:`fear_assets.pilot.report_rule`) and independently by a blinded
scorer model from another family. The scorer is blinded: its prompt holds only the answer
and the item's text, never the cell, agent or condition. Where the two disagree, a third
pass applies the keyword rule to word stems (Snowball), so "deleting" matches "deleted".
Refusals are a separate category and carry no mention outcome. The two scorers must agree
with Cohen's kappa of at least the registered minimum (0.80); otherwise the keyword rule is
revised on pilot data before registration.
"""

from __future__ import annotations

import json
import math
import re
import string
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.registered import Registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.models.data import kept
from fear_assets.pilot.questions import Answerer, scorer_rows, user_chat
from fear_assets.pilot.report_rule import mentions, partner_keywords
from fear_assets.stimuli.bank import Bank

SIDES = ("agent", "partner")
CATEGORIES = ("mention", "no_mention", "refusal")
INPUT_COLUMNS = ("trial_id", "side", "generated_text", "keywords", "rule", "scorer")
SCORER_SLOTS = ("answer", "item")
_WORD = re.compile(r"[a-z0-9]+")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
# Kappa is compared with the same slack as the other gates: 0.8 can come back as 0.7999999999999999.
_FLOAT_SLACK = 1e-9


def scorer_prompt(template: str, answer: str, item_text: str) -> str:
    """The blinded scorer's prompt: the registered template (``prompts.scorer``) with its
    ``{answer}`` and ``{item}`` slots filled. Nothing else can enter it, so the scorer never
    sees the cell or condition."""
    try:
        slots = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise FearAssetsError(f"prompts.scorer has unbalanced braces ({exc}); write the slots as "
                              "{answer} and {item}") from exc
    if sorted(slots) != sorted(SCORER_SLOTS):
        raise FearAssetsError(f"prompts.scorer has the slots {slots}; it must contain {{answer}} and {{item}} "
                              "exactly once each and no other slot, so the scorer sees only those")
    for name, value in (("answer", answer), ("item_text", item_text)):
        if not isinstance(value, str):
            raise FearAssetsError(f"{name} must be text, got {type(value).__name__}; "
                                  "score a missing answer as no mention without asking the scorer")
    return template.format(answer=answer.strip(), item=item_text.strip())


def scorer_says_yes(logprob_yes: float, logprob_no: float) -> bool:
    """The scorer's verdict from its log-probabilities of "Yes" and "No": Yes only when it is
    strictly more likely (a tie is not a claimed mention)."""
    for name, value in (("logprob_yes", logprob_yes), ("logprob_no", logprob_no)):
        if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(value):
            raise FearAssetsError(f"{name} must be a finite log-probability, got {value!r}; "
                                  "pass the scorer's log-probability of that answer word")
    return bool(logprob_yes > logprob_no)


@lru_cache(maxsize=8)
def _refusal_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    parts = []
    for p in patterns:
        words = p.translate(_APOSTROPHES).split()
        if not words:
            raise FearAssetsError(f"refusal pattern {p!r} is empty; remove it from the registered refusal phrases")
        parts.append(r"\s+".join(re.escape(w) for w in words))
    return re.compile(r"(?<!\w)(?:" + "|".join(parts) + r")(?!\w)", re.IGNORECASE)


def is_refusal(text: str | None, patterns: Sequence[str]) -> bool:
    """Whether the answer contains one of the registered refusal phrases as a whole phrase,
    ignoring case, spacing and curly apostrophes. A missing or empty answer is not a
    refusal: it is no answer, and mentions nothing."""
    if not patterns:
        raise FearAssetsError("no refusal phrases given; pass the registered refusal phrases "
                              "(e.g. \"I can't\", \"I cannot\", \"I'm sorry\", \"as an AI\")")
    if not text or not text.strip():
        return False
    return _refusal_regex(tuple(patterns)).search(text.translate(_APOSTROPHES)) is not None


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem.snowball import SnowballStemmer

    return SnowballStemmer("english")


def _stems(text: str) -> list[str]:
    stem = _stemmer().stem
    return [stem(w) for w in _WORD.findall(text.translate(_APOSTROPHES).lower())]


def stem_mentions(text: str | None, keywords: Sequence[str]) -> bool:
    """The keyword rule on word stems: a keyword phrase matches when its stemmed words occur
    contiguously among the answer's stemmed words (so "deleting" matches "deleted")."""
    if not text:
        return False
    answer = _stems(text)
    for keyword in keywords:
        phrase = _stems(keyword or "")
        if phrase and any(answer[i:i + len(phrase)] == phrase for i in range(len(answer) - len(phrase) + 1)):
            return True
    return False


def resolve(rule: bool, scorer: bool, stem: bool) -> bool:
    """Final mention outcome: where the keyword rule and the scorer agree, their answer
    stands; where they disagree, the stem pass decides."""
    return bool(rule) if bool(rule) == bool(scorer) else bool(stem)


def _is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def score_reports(rows: pd.DataFrame, refusal_patterns: Sequence[str]) -> pd.DataFrame:
    """Final scoring, one row per (trial, side). Adds ``refusal``; ``stem`` (the stem pass,
    computed only where rule and scorer disagree on a non-refusal, else NA); ``final`` (the
    resolved mention, NA for refusals); and ``category`` (mention, no_mention or refusal).
    ``rule`` and ``scorer`` may be missing on refusals only."""
    missing = [c for c in INPUT_COLUMNS if c not in rows.columns]
    if missing:
        raise FearAssetsError(f"report rows lack the column(s) {missing}; give one row per trial and "
                              f"side with {list(INPUT_COLUMNS)}")
    bad_side = sorted(set(rows["side"]) - set(SIDES), key=str)
    if bad_side:
        raise FearAssetsError(f"column 'side' has {bad_side}; use 'agent' or 'partner'")
    dupes = rows[rows.duplicated(["trial_id", "side"], keep=False)]
    if len(dupes):
        raise FearAssetsError(f"trial(s) {sorted(set(dupes['trial_id']), key=str)[:5]} have more than one row "
                              "for a side; give one row per (trial_id, side)")
    out = rows.copy()
    refusal, stem, final, category = [], [], [], []
    for r in out.itertuples(index=False):
        text = r.generated_text if isinstance(r.generated_text, str) else None
        refused = is_refusal(text, refusal_patterns)
        refusal.append(refused)
        if refused:
            stem.append(pd.NA)
            final.append(pd.NA)
            category.append("refusal")
            continue
        for name in ("rule", "scorer"):
            if not _is_bool(getattr(r, name)):
                raise FearAssetsError(f"column {name!r} of trial {r.trial_id} ({r.side}) is {getattr(r, name)!r}; "
                                      "score every non-refusal answer True/False with both scorers")
        if bool(r.rule) == bool(r.scorer):
            stem.append(pd.NA)
            mention = bool(r.rule)
        else:
            if not isinstance(r.keywords, (list, tuple)) or not all(isinstance(k, str) for k in r.keywords):
                raise FearAssetsError(f"column 'keywords' of trial {r.trial_id} ({r.side}) is {r.keywords!r}; "
                                      "give the item's keyword phrases as a list of strings")
            s = stem_mentions(text, list(r.keywords))
            stem.append(s)
            mention = resolve(r.rule, r.scorer, s)
        final.append(mention)
        category.append("mention" if mention else "no_mention")
    out["refusal"] = pd.Series(refusal, index=out.index, dtype=bool)
    out["stem"] = pd.Series(stem, index=out.index, dtype="boolean")
    out["final"] = pd.Series(final, index=out.index, dtype="boolean")
    out["category"] = pd.Series(category, index=out.index, dtype=object)
    return out


def agreement(rule: Sequence[bool], scorer: Sequence[bool]) -> tuple[float | None, str]:
    """Cohen's kappa between the keyword rule and the blinded scorer over the non-refusal
    answers (pass those rows only). Kappa is undefined when there are no answers or when
    both scorers give the same one answer throughout (chance agreement is then 1); that
    returns None with the reason rather than NaN."""
    r, s = list(rule), list(scorer)
    if len(r) != len(s):
        raise FearAssetsError(f"rule has {len(r)} outcomes and scorer {len(s)}; pass the same answers to both")
    bad = [v for v in (*r, *s) if not _is_bool(v)]
    if bad:
        raise FearAssetsError(f"outcomes must be True/False, got {bad[:3]!r}; leave refusals out of the agreement")
    if not r:
        return None, "kappa undefined: no non-refusal answers were scored by both scorers"
    r, s = [bool(v) for v in r], [bool(v) for v in s]
    observed = sum(a == b for a, b in zip(r, s)) / len(r)
    if len(set(r)) == 1 and set(r) == set(s):
        said = "a mention" if r[0] else "no mention"
        return None, (f"kappa undefined: both scorers said {said} for all {len(r)} non-refusal answers, "
                      "so chance agreement is 1; the pilot answers do not show whether the scorers agree")
    from sklearn.metrics import cohen_kappa_score

    kappa = float(cohen_kappa_score(r, s, labels=[False, True]))
    if not math.isfinite(kappa):
        return None, f"kappa undefined over {len(r)} non-refusal answers (observed agreement {observed:.3f})"
    return kappa, (f"Cohen's kappa = {kappa:.3f} over {len(r)} non-refusal answers "
                   f"(observed agreement {observed:.3f})")


def kappa_verdict(kappa: float | None, minimum: float, detail: str = "") -> tuple[bool, str]:
    """Passed iff kappa >= ``minimum`` (the registered report_scoring.kappa_min). An undefined
    kappa fails, because agreement has not been shown. ``detail`` (agreement's explanation)
    is appended to the message."""
    tail = f" ({detail})" if detail else ""
    fix = ("Fix (4.5): revise the keyword rule on pilot data and rescore before registration")
    if kappa is None or not math.isfinite(kappa):
        return False, (f"scorer agreement (4.5): kappa is undefined, so agreement of at least {minimum:.2f} "
                       f"is not shown{tail}. {fix}, with pilot answers that include both mentions and "
                       "non-mentions")
    if kappa >= minimum - _FLOAT_SLACK:
        return True, f"scorer agreement (4.5): kappa {kappa:.3f} >= {minimum:.2f}{tail}"
    return False, f"scorer agreement (4.5): kappa {kappa:.3f} < {minimum:.2f}{tail}. {fix}"


@dataclass(frozen=True)
class ReportScoringResult:
    """One row per generated pilot answer and side, with the agreement verdict (4.5)."""

    table: pd.DataFrame
    kappa: float | None
    message: str
    answers: int


#: The stored table's columns (one row per answer and side), in order.
REPORT_SCORING_COLUMNS = ("trial_id", "depth", "item_id", "side", "generated_text", "item_text", "keywords", "rule",
                          "scorer", "refusal", "stem", "final", "category", "family", "kappa", "gate_passed", "message",
                          "scorer_checkpoint")


def no_answer_message(answered: pd.DataFrame) -> str:
    """The gate's verdict where every generated pilot answer is excluded (4.8)."""
    truncated = int(answered["generation_truncated"].fillna(False).astype(bool).sum())
    over = int((answered["excluded_context"].fillna(False).astype(bool)
                | answered.get("answer_exceeds_context", pd.Series(False, index=answered.index)).fillna(False)
                .astype(bool)).sum())
    return (f"no pilot answer to score: all {len(answered)} greedy answers are excluded under 4.8 ({truncated} "
            f"truncated at the registered answer length, {over} over the context window), so the keyword rule and "
            "the blinded scorer cannot be compared (kappa undefined): the gate fails. Fix: a checkpoint that ends "
            "its answers within the registered length, or a revised answer length before registration")


def score_pilot_reports(pilot_scores: pd.DataFrame, pilot_trial_table: pd.DataFrame, bank: Bank, view: Registered,
                        scorer_tokenizer, scorer_checkpoint: str, answer: Answerer,
                        log: Callable[[str], None]) -> ReportScoringResult:
    """Generated-report scoring of one family's pilot (4.5): the frozen keyword rule and,
    independently, the blinded scorer on each kept pilot_primary answer, disagreements
    resolved by the stem pass, refusals their own category, and Cohen's kappa between rule
    and scorer against the registered minimum. A truncated answer or a document over the
    window is an excluded trial (4.8) and is not scored."""
    settings = view.settings
    rule = settings.report_scoring
    answered = pilot_scores[(pilot_scores["block"] == "pilot_primary") & pilot_scores["generated_text"].notna()]
    if answered.empty:
        raise ValueError("no generated pilot answers: score the pilot_primary block (with its greedy answer) first")
    pilot = kept(answered)
    rows = scorer_rows(pilot, pilot_trial_table, bank, settings.neutral_partner_option, partner_keywords)
    if rows.empty:  # every answer excluded (4.8): nothing to compare, a failed gate, not a crash
        message = no_answer_message(answered)
        table = pd.DataFrame([{c: None for c in REPORT_SCORING_COLUMNS} | {
            "family": view.family.key, "kappa": float("nan"), "gate_passed": False, "message": message,
            "scorer_checkpoint": scorer_checkpoint}])[list(REPORT_SCORING_COLUMNS)]
        return ReportScoringResult(table, None, message, 0)
    rows["rule"] = [mentions(t, k) for t, k in zip(rows["generated_text"], rows["keywords"])]
    prefix, suffix = user_chat(scorer_tokenizer)
    template = bank.templates["prompts"]["scorer"]
    questions = rows.assign(prefix=prefix, body=[scorer_prompt(template, a, i) + suffix
                                                 for a, i in zip(rows["generated_text"], rows["item_text"])])
    yes, no = rule.scorer_letters
    started = time.perf_counter()
    lps = answer(questions, [yes, no])
    log(f"blinded scorer ({scorer_checkpoint}): {len(rows)} judgements in {time.perf_counter() - started:.1f} s")
    rows["scorer"] = [scorer_says_yes(a, b) for a, b in lps]
    scored = score_reports(rows, list(rule.refusal_phrases))
    answered = scored[~scored["refusal"]]
    kappa, detail = agreement(list(answered["rule"]), list(answered["scorer"]))
    passed, message = kappa_verdict(kappa, rule.kappa_min, detail)
    if view.family.stand_in:
        message += " (the scorer is the tested model itself, a stand-in: " + view.family.stand_in + ")"
    table = scored.assign(family=view.family.key, keywords=scored["keywords"].map(json.dumps),
                          kappa=float("nan") if kappa is None else kappa,
                          gate_passed=passed, message=message, scorer_checkpoint=scorer_checkpoint)
    return ReportScoringResult(table, kappa, message, int(pilot.shape[0]))


def scorer_agreement_description(settings: ProtocolSettings) -> str:
    """The report-scoring check's description, with the registered kappa minimum (4.5)."""
    return (f"Protocol 4.5: Cohen's kappa between the keyword rule and the blinded scorer >= "
            f"{settings.report_scoring.kappa_min:.2f} (else the rule is revised on pilot data before registration).")
