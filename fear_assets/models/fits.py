"""Fitting the registered model to one block and reading band-averaged contrasts from it.

A :class:`Fit` holds the prepared data, the posterior, the band-averaged cell means and the
diagnostics; :func:`contrast_summary` turns any contrast's draws into the reported row
(mean, 99% HDI, label, and the contrast's own R-hat and bulk/tail ESS, which the
convergence check reads: 6.1 asks them of every reported contrast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.core.sections import Convergence
from fear_assets.models.data import AGENTS, levels_of, prepared
from fear_assets.models.primary_model import (COVARIATES, Fitter, PrimaryData, cell_means, check_band, convergence,
                                                frame_form_of, posterior_draws)
from fear_assets.models.decision import label


@dataclass
class Fit:
    name: str
    data: PrimaryData
    idata: object
    mu: dict
    band: list[str]
    rows: int
    diagnostics: dict

    #: How the frame effects were sampled (``analysis.parametrisation``; None: a joint model).
    frames: str | None = None

    @property
    def chains(self) -> int:
        return int(self.idata.posterior.sizes["chain"])


def fit_cells(fitter: Fitter, table: pd.DataFrame, fears: Sequence[str], band: Sequence[str], seed: int,
              name: str, agents: Sequence[str] = AGENTS, fixed_sd: float | None = None,
              covariates: Sequence[str] = COVARIATES) -> Fit:
    """The registered model on ``table`` (a model table, see ``data.model_table``); cell
    means averaged with equal weight over every ``band`` depth (a band depth without rows is
    a MissingBandDepthError, raised before sampling). ``fixed_sd`` replaces the fixed-effect
    prior sd (the prior-sensitivity refit)."""
    if table.empty:
        raise ValueError(f"{name}: no rows to fit; score the block first")
    levels = levels_of(table, fears, agents)
    present = check_band(band, levels["depth"], name)
    d = prepared(table, levels, covariates)
    idata = fitter.fit(d, seed, fixed_sd=fixed_sd)
    mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"), present)
    return Fit(name, d, idata, mu, present, len(table), convergence(idata), frame_form_of(idata))


def contrast_diagnostics(draws: np.ndarray, chains: int) -> dict:
    """R-hat and bulk/tail ESS of one contrast's draws (flattened chain-major)."""
    import arviz as az

    x = np.asarray(draws).reshape(chains, -1)
    return {"rhat": float(az.rhat(x)), "ess_bulk": float(az.ess(x, method="bulk")),
            "ess_tail": float(az.ess(x, method="tail"))}


def contrast_summary(name: str, draws: np.ndarray, chains: int, hdi_prob: float, sesoi: float,
                     rope: float | None = None, divergences: int = 0, **extra) -> dict:
    """One reported contrast: mean, HDI, the decision label (with ``rope`` as the SESOI when
    the contrast has its own scale, gate (c)), and its diagnostics."""
    import arviz as az

    low, high = (float(v) for v in az.hdi(np.asarray(draws), hdi_prob=hdi_prob))
    decision = label(low, high, rope if rope is not None else sesoi)
    return {"contrast": name, "mean": float(np.mean(draws)), "hdi_low": low, "hdi_high": high,
            "label": decision.label, "practically_meaningful": decision.practically_meaningful,
            **contrast_diagnostics(draws, chains), "divergences": int(divergences), **extra}


def convergence_problems(row: Mapping, rule: Convergence) -> list[str]:
    """What fails the registered convergence rule for one reported contrast."""
    out = []
    if not row["rhat"] <= rule.rhat_max:
        out.append(f"R-hat {row['rhat']:.3f} > {rule.rhat_max}")
    if not row["ess_bulk"] >= rule.ess_bulk_min:
        out.append(f"bulk ESS {row['ess_bulk']:.0f} < {rule.ess_bulk_min}")
    if not row["ess_tail"] >= rule.ess_tail_min:
        out.append(f"tail ESS {row['ess_tail']:.0f} < {rule.ess_tail_min}")
    if row["divergences"] > rule.divergences_max:
        out.append(f"{row['divergences']} divergences")
    return out


def diagnostics_problems(diagnostics: Mapping, rule: Convergence) -> list[str]:
    """The same rule applied to a whole fit's worst diagnostics (``primary_model.convergence``:
    max R-hat, min bulk/tail ESS, divergences), e.g. H4's fit."""
    return convergence_problems({"rhat": diagnostics["max_rhat"], "ess_bulk": diagnostics["min_ess_bulk"],
                                 "ess_tail": diagnostics["min_ess_tail"], "divergences": diagnostics["divergences"]},
                                rule)


#: The label a contrast is reported with when it still misses the convergence rule after the
#: registered remedy (its HDI label stays in ``label``, flagged and never read).
NOT_CONVERGED = "not converged"


def remedy_draws(draws: int, remedy) -> list[int]:
    """Draws per chain of each run the registered remedy allows (settings
    ``fitting.convergence_remedy``): the registered run, then each extension adding
    ``extension_draws``, ``max_extensions`` times. ``remedy`` None: the registered run only."""
    if remedy is None:
        return [int(draws)]
    return [int(draws) + k * int(remedy.extension_draws) for k in range(int(remedy.max_extensions) + 1)]


@dataclass
class Remedied:
    value: object  # what the last run returned (its fit)
    rows: list[dict]  # the last run's contrast rows, each with its convergence outcome
    draws: dict[str, np.ndarray]  # the last run's contrast draws
    runs: list[dict]  # one record per run: fit, run, draws per chain, the contrasts short and why


def remedied(name: str, run_at: Callable[[int], tuple[object, list[tuple[dict, np.ndarray]]]],
             schedule: Sequence[int], rule: Mapping) -> Remedied:
    """The registered remedy for a fit whose reported contrasts miss the convergence rule:
    ``run_at(draws)`` fits with that many draws per chain (the same seeds) and returns (fit,
    [(contrast row, draws), ...]); it is rerun at each longer draw count of ``schedule``
    while any of its contrasts misses ``rule``, every run recorded. A contrast still short
    after the last run keeps its HDI label in ``label`` and is reported as ``NOT_CONVERGED``
    (``label_reported``); the rows carry the runs made and the draws of the run reported."""
    runs, value, pairs = [], None, []
    for i, n in enumerate(schedule):
        value, pairs = run_at(int(n))
        short = {row["contrast"]: convergence_problems(row, rule) for row, _ in pairs}
        short = {k: v for k, v in short.items() if v}
        runs.append({"fit": name, "run": i, "draws_per_chain": int(n), "contrasts_short": ", ".join(short),
                     "problems": " | ".join(f"{k}: {'; '.join(v)}" for k, v in short.items())})
        if not short:
            break
    rows = []
    for row, _ in pairs:
        problems = convergence_problems(row, rule)
        rows.append({**row, "convergence_problems": "; ".join(problems), "fit_runs": len(runs),
                     "draws_per_chain": runs[-1]["draws_per_chain"],
                     "label_reported": NOT_CONVERGED if problems else row["label"]})
    return Remedied(value, rows, {row["contrast"]: np.asarray(x) for row, x in pairs}, runs)
