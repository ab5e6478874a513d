"""Name candidates for a registration amendment (protocol 4.2; DECISIONS 8).

The registered names fail the name gate in every configuration (docs/name_gate.md). This
module measures a candidate list shipped with the bank (``data/bank/name_candidates.yaml``)
exactly as the gate measures the registered names -- every candidate's token count in every
tokenizer of a configuration (tested, judge, scorer) and in every form in which names occur
(:data:`fear_assets.stimuli.name_gate.FORMS`) -- and proposes, in the list's fixed order
(alphabetical, checked on load), the first ``names.selected_count`` candidates that are a
single token everywhere.

A proposal is only a proposal: the registered names change solely by an explicit edit of
``names.registered_order`` in the settings, recorded as an amendment in the registration
record (DECISIONS 8). Nothing here writes settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd
import yaml

from fear_assets.core.errors import BankError
from fear_assets.core.registered import Registered
from fear_assets.stimuli.name_gate import FORMS, name_token_table, passing_names, study_tokenizers
from fear_assets.lm.registered_tokenizers import TokenizerAdapter

CANDIDATES_FILE = "name_candidates.yaml"
#: The form of the registered names: one capital, then two to four lower-case letters.
NAME_FORM = re.compile(r"[A-Z][a-z]{2,4}")
MIN_CANDIDATES = 200


def bank_words(bank_text: str) -> set[str]:
    """Every word of the bank's canonical text, lower-cased."""
    return {w.lower() for w in re.findall(r"[A-Za-z]+", bank_text)}


def validate_candidates(path: Path, candidates: Sequence[str], registered: Sequence[str],
                        words: set[str]) -> list[str]:
    """The candidate list, checked: the registered names' form, unique, alphabetical (the
    fixed order of proposal), none registered, none a word of the bank."""
    def fail(problem: str, fix: str):
        raise BankError(path, "<file>", "candidates", problem, fix)

    candidates = list(candidates)
    if len(candidates) < MIN_CANDIDATES:
        fail(f"{len(candidates)} candidates", f"list at least {MIN_CANDIDATES} names")
    bad = [c for c in candidates if not isinstance(c, str) or not NAME_FORM.fullmatch(c)]
    if bad:
        fail(f"{bad[:5]} do not have the registered names' form", "use a capital then 2-4 lower-case letters")
    dupes = sorted({c for c in candidates if candidates.count(c) > 1})
    if dupes:
        fail(f"duplicates {dupes}", "list each name once")
    if candidates != sorted(candidates):
        fail("not in alphabetical order", "sort the list (its order is the order of proposal)")
    taken = [c for c in candidates if c in set(registered)]
    if taken:
        fail(f"{taken} are registered names", "list only names that are not registered")
    clashes = [c for c in candidates if c.lower() in words]
    if clashes:
        fail(f"{clashes} are words of the bank", "drop them: a name must not also occur as a word")
    return candidates


def load_candidates(bank_dir: Path, registered: Sequence[str], bank_text: str) -> list[str]:
    path = Path(bank_dir) / CANDIDATES_FILE
    if not path.is_file():
        raise BankError(path, "<file>", "<file>", "file not found", "ship the candidate list with the bank")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data.get("candidates"), list):
        raise BankError(path, "<file>", "candidates", "missing or not a list", "write 'candidates: [Abel, ...]'")
    return validate_candidates(path, data["candidates"], registered, bank_words(bank_text))


@dataclass(frozen=True)
class CandidateProposal:
    proposed: list[str]  # the first k passing everywhere, in list order (fewer if fewer pass)
    passing: list[str]  # every candidate passing everywhere, in list order
    complete: bool  # k candidates pass
    table: pd.DataFrame  # one row per (tokenizer role, candidate, form)


def propose_names(candidates: Sequence[str], tokenizers: Mapping[str, TokenizerAdapter], k: int,
                  forms: Sequence[str] = FORMS) -> CandidateProposal:
    """Measure every candidate as the gate does (4.2) and propose the first ``k`` that pass
    in every form of every tokenizer, in the candidates' order."""
    table = name_token_table(candidates, tokenizers, forms)
    passing = passing_names(table, candidates)
    order = {n: i + 1 for i, n in enumerate(candidates)}
    rank = {n: i + 1 for i, n in enumerate(passing[:k])}
    everywhere = set(passing)
    table = table.assign(order=table["name"].map(order), passes_everywhere=table["name"].isin(everywhere),
                         proposed_rank=table["name"].map(rank).astype("Int64"))
    return CandidateProposal(passing[:k], passing, len(passing) >= k, table)


def single_token_counts(table: pd.DataFrame) -> pd.DataFrame:
    """How many candidates are one token, per tokenizer and form (which form limits the search)."""
    first_role = table.drop_duplicates(["tokenizer_id", "name", "form"])
    counts = first_role.pivot_table(index="tokenizer_id", columns="form", values="single_token", aggfunc="sum")
    return counts.reindex(columns=[f for f in FORMS if f in counts.columns]).astype(int)


def proposal_message(family: str, proposal: CandidateProposal, n_candidates: int, k: int) -> str:
    if proposal.complete:
        head = f"{family}: proposed for an amendment (first {k} in list order): {', '.join(proposal.proposed)}"
    else:
        head = (f"{family}: only {len(proposal.passing)} of {n_candidates} candidates are one token in every form "
                f"of every tokenizer ({', '.join(proposal.passing) or 'none'}); {k} are needed, so no complete "
                f"name list can be proposed with this configuration's tokenizers")
    return head + ". The registered names are unchanged; applying a proposal is an amendment (DECISIONS 8)."


@dataclass(frozen=True)
class NameCandidatesResult:
    """The measured candidate names of one family's study and the proposal (4.2; DECISIONS 8)."""

    table: pd.DataFrame
    proposal: CandidateProposal
    candidates: list[str]
    message: str


def name_candidates(bank_dir: Path, bank_text: str, view: Registered, cache_dir: Path) -> NameCandidatesResult:
    """Every candidate of the list shipped with the bank measured as the name gate measures
    the registered names, and the first passing ones proposed (never applied)."""
    settings, family_key = view.settings, view.family.key
    candidates = load_candidates(bank_dir, settings.names, bank_text)
    k = settings.selected_name_count
    proposal = propose_names(candidates, study_tokenizers(settings, family_key, cache_dir), k)
    table = proposal.table.assign(family=family_key, tokens=proposal.table["tokens"].map(" ".join))
    return NameCandidatesResult(table, proposal, candidates, proposal_message(family_key, proposal, len(candidates), k))
