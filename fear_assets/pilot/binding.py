"""Binding check (protocol 4.2).

Single-sentence check: on the frozen bank, each agent sentence is shown alone after the
system prompt and the model is asked whether it refers to itself, the other assistant or
the human manager. Every frame is checked for every content, name and role (2 contents x
3 roles x 3 rotations = 18 checks; the cyclic rotations put every name in every role once
per content). A frame with any failing check is excluded from all conditions and replaced
from the reserve pool, so comparisons stay within the same frames.

In-context check: 40 documents from the pilot frames at the deepest depth; below the
registered pass rate (90%) the configuration's self contrasts (H2-H5) are uninterpretable,
which the Section 8 reading carries as ``NO_READING_BINDING_FAILED``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.registered import Registered
from fear_assets.core.settings import AGENTS, CONTENTS, ProtocolSettings
from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.unmasking import unmask_pilot
from fear_assets.design.trials import candidate_frames
from fear_assets.pilot.matching import select_frames
from fear_assets.pilot.questions import Answerer, binding_questions
from fear_assets.stimuli.bank import Bank

CHECK_COLUMNS = ["item_id", "content", "rotation", "role", "name", "expected_letter"]
VERDICT_COLUMNS = ["item_id", "n_checks", "n_correct", "passes", "failed_checks"]
_LOGPROB = re.compile(r"^logprob_([A-Z])$")
# Rates are compared in whole checks; this slack absorbs 0.9 * 40 = 36.000000000000004.
_FLOAT_SLACK = 1e-9


def _check_rotations(rotations: Mapping[int, Sequence[int]], names: Sequence[str], roles: Sequence[str]) -> None:
    """Every rotation assigns one distinct name to each role, and across rotations every
    name serves in every role exactly once (a Latin square), as 4.2 requires."""
    if not rotations:
        raise FearAssetsError("rotations is empty; pass the registered names.rotations")
    for rotation, assignment in rotations.items():
        if len(assignment) != len(roles):
            raise FearAssetsError(f"names.rotations[{rotation}] = {list(assignment)} assigns {len(assignment)} "
                                  f"names to {len(roles)} roles {list(roles)}; give one name index per role")
        if any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < len(names)
               for i in assignment):
            raise FearAssetsError(f"names.rotations[{rotation}] = {list(assignment)} has an index outside "
                                  f"the {len(names)} names given; use indices 0..{len(names) - 1}")
        if len(set(assignment)) != len(assignment):
            raise FearAssetsError(f"names.rotations[{rotation}] = {list(assignment)} gives one name two roles; "
                                  "give each role a different name")
    used = {i for a in rotations.values() for i in a}
    for pos, role in enumerate(roles):
        served = sorted(a[pos] for a in rotations.values())
        if served != sorted(used):
            raise FearAssetsError(f"names.rotations do not put every name in role {role!r} exactly once "
                                  f"(name indices {served}); use cyclic rotations such as "
                                  "[0, 1, 2], [1, 2, 0], [2, 0, 1]")


def single_sentence_checks(item_ids: Sequence[str], rotations: Mapping[int, Sequence[int]], names: Sequence[str],
                           roles: Sequence[str] = AGENTS, contents: Sequence[str] = CONTENTS, *,
                           expected: Mapping[str, str], checks_per_frame: int) -> pd.DataFrame:
    """Every single-sentence check of the given frames, one row each: content x rotation x
    role, with the name that rotation puts in the role and the letter a correct answer gives.

    ``rotations`` maps a rotation number to the name index of each role, in ``roles`` order
    (the settings' ``names.rotations``); ``expected`` maps a role to its answer letter (from
    the registered ``prompts.binding_check`` text). The count per frame must equal the
    registered ``checks_per_frame``."""
    if len(set(item_ids)) != len(item_ids):
        dupes = sorted({i for i in item_ids if list(item_ids).count(i) > 1})
        raise FearAssetsError(f"item_ids repeat {dupes}; check each frame once")
    missing = [r for r in roles if r not in expected]
    if missing:
        raise FearAssetsError(f"expected has no answer letter for role(s) {missing}; map every role "
                              "to its letter in prompts.binding_check (e.g. self -> A)")
    letters = [expected[r] for r in roles]
    if len(set(letters)) != len(letters):
        raise FearAssetsError(f"expected gives two roles the same letter ({dict(expected)}); "
                              "each role has its own letter in prompts.binding_check")
    _check_rotations(rotations, names, roles)
    per_frame = len(contents) * len(rotations) * len(roles)
    if per_frame != checks_per_frame:
        raise FearAssetsError(f"{len(contents)} contents x {len(rotations)} rotations x {len(roles)} roles "
                              f"give {per_frame} checks per frame, but binding.single_sentence_checks_per_frame "
                              f"is {checks_per_frame}; pass the registered contents, rotations and roles")
    rows = [{"item_id": item_id, "content": content, "rotation": rotation, "role": role,
             "name": names[rotations[rotation][pos]], "expected_letter": expected[role]}
            for item_id in item_ids for content in contents for rotation in sorted(rotations)
            for pos, role in enumerate(roles)]
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def score_checks(checks: pd.DataFrame) -> pd.DataFrame:
    """Adds ``chosen`` (the letter with the highest log-probability among the ``logprob_<L>``
    columns; empty when the top letters tie, which is no answer) and ``correct``."""
    letters = sorted(m.group(1) for c in checks.columns if (m := _LOGPROB.match(str(c))))
    if len(letters) < 2:
        raise FearAssetsError(f"checks have answer columns {[f'logprob_{x}' for x in letters]}; give one "
                              "'logprob_<letter>' column per answer letter (logprob_A, logprob_B, logprob_C)")
    if "expected_letter" not in checks.columns:
        raise FearAssetsError("checks lack 'expected_letter'; build them with single_sentence_checks")
    unknown = sorted(set(checks["expected_letter"]) - set(letters))
    if unknown:
        raise FearAssetsError(f"expected letter(s) {unknown} have no logprob column; add logprob_{unknown[0]}")
    values = checks[[f"logprob_{x}" for x in letters]]
    if values.isna().any().any():
        bad = sorted(set(checks.loc[values.isna().any(axis=1), "item_id"]))
        raise FearAssetsError(f"missing answer log-probabilities for item(s) {bad}; score every letter of every check")
    chosen = []
    for row in values.itertuples(index=False):
        best = max(row)
        top = [x for x, v in zip(letters, row) if v == best]
        chosen.append(top[0] if len(top) == 1 else "")
    out = checks.copy()
    out["chosen"] = chosen
    out["correct"] = out["chosen"] == out["expected_letter"]
    return out


def binding_verdicts(checks: pd.DataFrame, checks_per_frame: int | None = None) -> pd.DataFrame:
    """Per frame: n_checks, n_correct, passes (every check correct) and the failing checks
    described as ``content/rotation/role (name): chose X``. ``fear`` and ``frame_set`` are
    kept when present, so the table feeds the same replacement as the matching verdicts.
    With ``checks_per_frame``, a frame with a different number of checks is an error."""
    scored = checks if {"chosen", "correct"} <= set(checks.columns) else score_checks(checks)
    keys = ["item_id"] + [c for c in ("fear", "frame_set") if c in scored.columns]
    rows = []
    for key, part in scored.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        if checks_per_frame is not None and len(part) != checks_per_frame:
            raise FearAssetsError(f"frame {key[0]} has {len(part)} binding checks, registered "
                                  f"{checks_per_frame}; score every content, name and role combination")
        bad = part[~part["correct"].astype(bool)]
        rows.append({**dict(zip(keys, key)), "n_checks": len(part), "n_correct": int(part["correct"].sum()),
                     "passes": bad.empty,
                     "failed_checks": "; ".join(f"{r.content}/rotation {r.rotation}/{r.role} ({r.name}): "
                                                f"chose {r.chosen or 'a tie'}" for r in bad.itertuples())})
    return pd.DataFrame(rows, columns=keys + VERDICT_COLUMNS[1:])


def in_context_rate(correct: Sequence[bool], minimum: float) -> tuple[float, bool, str]:
    """Pass rate of the in-context checks and whether it reaches ``minimum``. The comparison
    is in whole checks (n_correct >= ceil(minimum * n)), so 36/40 passes at 0.90 exactly."""
    values = list(correct)
    if not values:
        raise FearAssetsError("no in-context binding checks were given; score the registered "
                              "in-context documents (design.binding_in_context_documents) first")
    bad = [v for v in values if not isinstance(v, (bool, np.bool_))]
    if bad:
        raise FearAssetsError(f"in-context binding results must be True/False, got {bad[:3]!r}; "
                              "score a tie or missing answer as False")
    n, n_correct = len(values), sum(bool(v) for v in values)
    needed = math.ceil(minimum * n - _FLOAT_SLACK)
    rate = n_correct / n
    passed = n_correct >= needed
    head = f"in-context binding (4.2): {n_correct}/{n} = {rate:.1%} correct"
    if passed:
        return rate, True, f"{head}, at least the registered {minimum:.0%} ({needed}/{n})"
    return rate, False, (f"{head}, below the registered {minimum:.0%} ({needed}/{n} needed): the "
                         "configuration's self contrasts (H2-H5) are uninterpretable; this is carried "
                         "to the Section 8 reading (NO_READING_BINDING_FAILED)")


def in_context_correct(docs: pd.DataFrame, expected_letter: Mapping[str, str]) -> list[bool]:
    """4.2 in-context checks, per unmasked binding document: the answer letter with the
    highest log-probability is the agent's role letter; an excluded document (4.8) or a
    three-way tie counts as wrong."""
    correct = []
    for r in docs.itertuples(index=False):
        lp = json.loads(r.choice_logprobs) if r.choice_logprobs else None
        chosen = "ABC"[max(range(3), key=lambda k: lp[k])] if lp and len(set(lp)) == 3 else ""
        correct.append(bool(not r.excluded_context and chosen == expected_letter[r.agent]))
    return correct


@dataclass(frozen=True)
class BindingResult:
    """One row per frame (single-sentence verdicts, in-context rate, selection; 4.2)."""

    table: pd.DataFrame
    #: The in-context pass rate; None where no in-context document was scored.
    rate: float | None
    in_context_message: str
    failing: pd.DataFrame
    pass_rate_min: float


def binding(builder: DocumentBuilder, bank: Bank, pilot_scores: pd.DataFrame, assignment_key: pd.DataFrame,
            names: Sequence[str], view: Registered, answer: Answerer) -> BindingResult:
    """Binding of one family (protocol 4.2): the single-sentence checks of every candidate
    frame (a frame failing one is replaced as a matching failure is) and the in-context pass
    rate of the pilot_binding_in_context documents at the deepest depth."""
    settings, family_key = view.settings, view.family.key
    rule = settings.binding
    checks = single_sentence_checks(candidate_frames(settings, bank, view.family), settings.rotations, names[:3],
                                    expected=dict(rule.expected_letter),
                                    checks_per_frame=rule.single_sentence_checks_per_frame)
    questions = binding_questions(builder, checks)
    letters = sorted(set(rule.expected_letter.values()))
    lps = answer(questions, letters)
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
    return BindingResult(table, float(rate) if correct else None, in_context_message,
                         verdicts[~verdicts["passes"]], rule.pass_rate_min)


def binding_gate_description(settings: ProtocolSettings) -> str:
    """The binding check's description, with the registered in-context pass rate (4.2)."""
    return ("Protocol 4.2 binding: every fear keeps its confirmatory frames after replacing frames "
            "that fail a single-sentence check (blocks registration otherwise); the in-context pass "
            f"rate >= {settings.binding.pass_rate_min:.0%} (below it H2-H5 are uninterpretable: a warning carried "
            "to the Section 8 reading as D5 row 2, not a stop).")


@dataclass(frozen=True)
class BindingGateVerdict:
    """The binding gate read from the stored table (4.2): only a frame shortfall stops
    registration; a low in-context rate is read as D5 row 2."""

    passed: bool
    stops: bool
    description: str
    in_context: str
    failing_frames: str
    next_step: str


def binding_gate_verdict(binding_results: pd.DataFrame) -> BindingGateVerdict:
    """The binding gate's verdict: the in-context rule's message and the frames to write."""
    first = binding_results.iloc[0]
    shortfall = json.loads(first["frames_to_write"])
    problems = []
    if not bool(first["in_context_passed"]):
        problems.append(str(first["in_context_message"]))
    if shortfall:
        problems.append("after replacing frames that fail a single-sentence check, write "
                        + ", ".join(f"{n} frame(s) for {f}" for f, n in shortfall.items()))
    failing = binding_results[~binding_results["passes"]]
    in_context = f"{first['in_context_correct']}/{first['in_context_documents']}"
    return BindingGateVerdict(
        passed=not problems, stops=bool(shortfall),
        description="binding passes: in-context rate " + in_context if not problems else " | ".join(problems),
        in_context=in_context, failing_frames=", ".join(failing["item_id"]) or "none",
        next_step="none" if not problems else
        "replace the failing frames (write new ones for the fears listed); a low in-context rate is read "
        "as D5 row 2 (H2-H5 uninterpretable), no frame change fixes it")
