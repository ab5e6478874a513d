"""H4, carriage (protocol 6.1): the primary model on probe log-odds.

"H4 ... the primary model on probe log-odds, both content versions of each document
entered separately, with an option term and a document intercept; the H2 contrast on that
scale averaged over the band depths." Pure functions of tables, under the registered code
hash: the model table, its factor levels, one fit and the flags the reading carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.data import covariate_centres, sentence_covariates
from fear_assets.models.fits import diagnostics_problems
from fear_assets.models.primary_model import (Priors, build_model, cell_means, convergence, hypotheses,
                                                posterior_draws, prepare, sample)
from fear_assets.probes.carriage import h4_interpretable
from fear_assets.models.decision import ESTIMATION_ONLY, label
from fear_assets.registration.gates import H4_PILOT_FIELD, declared_estimation_only
from fear_assets.core.settings import AGENTS, CONTENTS, depth_key


def h4_data(outputs: pd.DataFrame, surprisal: pd.DataFrame, fears_of: Mapping[str, str],
            neutral_option: int) -> pd.DataFrame:
    """Model table of H4: one row per probed document version, with the registered
    covariates (agent sentence's name NLL; rest NLL minus the partner's), centred on their
    bank means (D3b, as every fit of the primary model)."""
    d = outputs.rename(columns={"fold_rotation": "rotation", "content_option": "option"}).copy()
    d = d.merge(sentence_covariates(surprisal, neutral_option), on=["item_id", "rotation", "agent", "content", "option"],
                how="left")
    for cov, centre in covariate_centres(surprisal, neutral_option).items():
        d[cov] = d[cov] - centre
    d["depth"] = [depth_key(int(i)) for i in d["depth_index"]]
    d["frame"] = d["item_id"]
    d["fear"] = [fears_of[i] for i in d["item_id"]]
    d["unit"] = d["item_id"] + "|r" + d["rotation"].astype(str) + "|o" + d["order"].astype(str) + "|" + d["depth"]
    d["document"] = d["unit"] + "|" + d["condition_code"]
    return d


def h4_levels(data: pd.DataFrame, fears: Sequence[str]) -> dict[str, list]:
    """Factor levels of the H4 model: the registered agents and contents, the rest as present."""
    present = lambda col: sorted(data[col].unique(), key=str)
    return {"agent": list(AGENTS), "content": list(CONTENTS), "depth": present("depth"), "order": present("order"),
            "option": present("option"), "rotation": present("rotation"),
            "fear": [f for f in fears if f in set(data["fear"])]}


@dataclass(frozen=True)
class H4Fit:
    mean: float
    hdi_low: float
    hdi_high: float
    label: str
    practically_meaningful: bool
    diagnostics: dict
    idata: object
    #: The H4 contrast's draws (chain-major), for its trace and rank plots.
    draws: np.ndarray | None = None


def h4_model_data(data: pd.DataFrame, fears: Sequence[str]):
    """The primary model's inputs on probe log-odds with the document intercept (6.1)."""
    return prepare(data, h4_levels(data, fears), outcome="log_odds", document="document")


def fit_h4(data: pd.DataFrame, fears: Sequence[str], band: Sequence[int], priors: Priors, draws: int, tune: int,
           chains: int, seed: int, hdi_prob: float, sesoi: float) -> H4Fit:
    """One H4 fit; a band depth without probe documents is a MissingBandDepthError (from
    ``cell_means``), not a smaller band."""
    d = h4_model_data(data, fears)
    idata = sample(build_model(d, priors), draws, tune, chains, seed)
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"),
                    [depth_key(b) for b in band])
    h4 = np.asarray(hypotheses(mu)["H2"])
    import arviz as az

    low, high = (float(v) for v in az.hdi(h4, hdi_prob=hdi_prob))
    decision = label(low, high, sesoi)
    return H4Fit(float(h4.mean()), low, high, decision.label, decision.practically_meaningful, convergence(idata), idata,
                 h4)


#: H4's label when a control probe decodes away from chance (6.1: "H4 is declared uninterpretable").
UNINTERPRETABLE = "uninterpretable"


def h4_declared(controls: pd.DataFrame, record: Mapping) -> tuple[bool, bool]:
    """(interpretable, estimation_only) of H4 under 6.1's two rules and 6.3's power rule.
    Uninterpretable if any control probe, of the analysed frame set or of the pilot (the
    record's ``h4_pilot``), has a 99% interval excluding 0.5 (6.1 says "any control probe").
    Estimation-only if the record declares it before collection: the pilot probe above the
    ceiling, or H4 still below its power targets (``declared_estimation_only``); read from the
    record, never from the confirmatory probe's table (which has no ceiling column)."""
    pilot = record.get(H4_PILOT_FIELD)
    pilot = pilot if isinstance(pilot, Mapping) else {}
    interpretable = (controls.empty or h4_interpretable(controls)) and pilot.get("interpretable") is not False
    return bool(interpretable), "H4" in declared_estimation_only(record)


def h4_label(rule_label: str, interpretable: bool, estimation_only: bool) -> str:
    """H4's reported label: uninterpretable before estimation-only (a leaking pipeline makes
    its interval meaningless, not merely unjudged), then the 6.2 rule's label."""
    if not interpretable:
        return UNINTERPRETABLE
    return ESTIMATION_ONLY if estimation_only else rule_label


def h4_flags(diagnostics: Mapping, convergence_rule: Mapping, interpretable: bool, estimation_only: bool,
             frame_set: str, frames: int) -> list[str]:
    """What H4's row carries (6.1): non-convergence (the label is not read), an
    uninterpretable H4 (a control probe decodes away from chance), estimation-only (declared
    before collection) and pilot-only data (descriptive). Flags on H4 alone: 6.2, H4 never
    changes the reading."""
    flags = []
    problems = diagnostics_problems(diagnostics, convergence_rule)
    if problems:
        flags.append("NOT CONVERGED (" + "; ".join(problems) + "): the label is not to be read")
    if not interpretable:
        flags.append("H4 uninterpretable: a control probe decodes away from chance")
    if estimation_only:
        flags.append("H4 estimation-only (declared before collection: pilot probe above the ceiling, 6.1, or below "
                     "its power targets, 6.3): reported with its interval, not judged by the rule")
    if frame_set == "pilot":
        flags.append(f"pilot frames only ({frames}): descriptive")
    return flags


