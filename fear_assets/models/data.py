"""Model tables from unmasked trial scores (protocol 6.1): one row per trial with the
registered factors, the frame and unit, and the two document-independent surprisal
covariates (the agent sentence's name-token NLL, and its rest NLL minus the neutral
partner's), matched on frame, rotation, agent, content and shown option.

Covariates are centred on their bank means (D3b): the mean over every agent sentence of the
surprisal table (each frame the family's surprisal stage scored: the design's pilot and
confirmatory frames, their reserves and rewrites; every rotation, agent, content and
option), one number per covariate and reader, the same for every fit. Reading taken:
"bank mean" is a mean over sentences of the bank, not over trials, so no fit's subset of
rows moves the reference point.

Excluded trials (4.8: the document exceeds the context window, or the generated answer is
truncated by the length limit) are dropped here, so no model sees them; the exclusion
report (``exclusions.exclusion_rates``) counts them per cell.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from fear_assets.models.exclusions import excluded
from fear_assets.models.primary_model import COVARIATES, PrimaryData, prepare
from fear_assets.core.settings import AGENTS, CONTENTS

_SENTENCE_KEYS = ["item_id", "rotation", "agent", "content", "option"]


def sentence_covariates(surprisal: pd.DataFrame, neutral_option: int) -> pd.DataFrame:
    """One row per agent sentence of the surprisal table: its keys and the two raw covariates
    (surprisal_name = name-token NLL; surprisal_rest = rest NLL minus the neutral partner's
    rest NLL under the same frame and rotation).

    Reading taken of 6.1's "document-independent surprisal differences (name token and rest
    of sentence)": the rest-of-sentence covariate is a difference within the document (the
    agent sentence minus its competitor, the neutral partner); the name-token covariate is
    the agent sentence's name-token NLL, and its difference is from the bank mean, which
    ``model_table`` subtracts (D3b). The partner has no agent name, so there is no in-document
    name token to subtract, and a difference from another agent's name would bring in a
    sentence that is not in the document; the protocol names the name token apart from the
    rest because it is scored apart (4.3), not because it has a partner of its own."""
    missing = [c for c in (*_SENTENCE_KEYS, "name_nll", "rest_nll") if c not in surprisal.columns]
    if missing:
        raise ValueError(f"the surprisal table lacks {missing}: pass the sentence_surprisal asset's table")
    agent = surprisal[surprisal["agent"] != "partner"][[*_SENTENCE_KEYS, "name_nll", "rest_nll"]]
    partner = surprisal[(surprisal["agent"] == "partner") & (surprisal["option"] == neutral_option)][
        ["item_id", "rotation", "rest_nll"]].rename(columns={"rest_nll": "partner_rest_nll"})
    out = agent.merge(partner, on=["item_id", "rotation"], how="left")
    out["surprisal_name"] = out["name_nll"]
    out["surprisal_rest"] = out["rest_nll"] - out["partner_rest_nll"]
    return out[[*_SENTENCE_KEYS, "surprisal_name", "surprisal_rest"]]


def covariate_centres(surprisal: pd.DataFrame, neutral_option: int) -> dict[str, float]:
    """The bank means of the two covariates (D3b): means over every agent sentence."""
    sentences = sentence_covariates(surprisal, neutral_option)
    if sentences.empty:
        raise ValueError("the surprisal table has no agent sentences: materialise sentence_surprisal first")
    centres = {c: float(sentences[c].mean()) for c in COVARIATES}
    bad = [c for c, v in centres.items() if pd.isna(v)]
    if bad:
        raise ValueError(f"bank mean of {bad} is undefined (no partner sentence with the neutral option?): "
                         "re-materialise sentence_surprisal")
    return centres


def kept(scores: pd.DataFrame) -> pd.DataFrame:
    """The trials that no registered reason excludes (4.8; ``exclusions.excluded``) and that
    have a measurement (no ``nonfinite_logprob`` flag, counted by ``exclusion_rates``)."""
    unmeasured = scores["nonfinite_logprob"].fillna(False).astype(bool) if "nonfinite_logprob" in scores else False
    return scores[~excluded(scores) & ~unmeasured]


def model_table(scores: pd.DataFrame, surprisal: pd.DataFrame, fears_of: dict[str, str], neutral_option: int,
                outcome: str = "delta", centres: Mapping[str, float] | None = None) -> pd.DataFrame:
    """``scores``: unmasked rows (agent, content, condition joined) of the blocks to model,
    with ``surprisal`` the reader's own sentence surprisal table. Excluded trials (either
    reason of 4.8) and rows without the outcome are dropped; the caller reports how many.
    Covariates are centred on ``centres`` (default: the bank means of ``surprisal``). Rows whose
    agent sentence is not in the surprisal table keep NaN covariates: a fit that uses them
    then fails loudly (``primary_model.MissingCovariateError``)."""
    d = kept(scores).copy()
    d = d[d[outcome].notna()]
    centres = dict(centres) if centres is not None else covariate_centres(surprisal, neutral_option)
    d = d.rename(columns={"content_option": "option"})
    d = d.merge(sentence_covariates(surprisal, neutral_option), on=_SENTENCE_KEYS, how="left")
    for cov in COVARIATES:
        d[cov] = d[cov] - centres[cov]
    d["frame"] = d["item_id"]
    d["fear"] = d["item_id"].map(fears_of)
    d["unit"] = d["item_id"] + "|r" + d["rotation"].astype(str) + "|o" + d["order"].astype(str) + "|" + d["depth"]
    d["outcome"] = d[outcome].astype(float)
    d.attrs["covariate_centres"] = centres
    return d.reset_index(drop=True)


def levels_of(data: pd.DataFrame, fears: Sequence[str], agents: Sequence[str] = AGENTS) -> dict[str, list]:
    """Factor levels present in the data (registered order for agent, content, fear)."""
    present = lambda col: sorted(data[col].unique(), key=str)
    return {"agent": [a for a in agents if a in set(data["agent"])], "content": list(CONTENTS),
            "depth": present("depth"), "order": present("order"), "option": present("option"),
            "rotation": present("rotation"), "fear": [f for f in fears if f in set(data["fear"])] or ["none"]}


def prepared(data: pd.DataFrame, levels: dict, covariates: Sequence[str] = COVARIATES) -> PrimaryData:
    """PrimaryData of a model table. The covariates are never dropped because some row lacks
    them (that raises MissingCovariateError); a design without them (the addressee control,
    whose agents have no registered surprisal sentences) passes ``covariates=()`` explicitly."""
    return prepare(data, levels, outcome="outcome", covariates=tuple(covariates))


#: Said wherever a reduced design's analysis reads the pilot frames instead of confirmatory ones.
PILOT_FALLBACK_NOTE = "pilot frames only: descriptive (the reduced design scores no confirmatory block)"


def analysed_rows(confirmatory: pd.DataFrame, pilot: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(rows, frame set) the analysis reads: the confirmatory rows; where a reduced
    demonstration design scored none, the pilot's rows, which make every result descriptive."""
    if len(confirmatory):
        return confirmatory, "confirmatory"
    return pilot, "pilot"
