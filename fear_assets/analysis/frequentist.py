"""The frequentist sensitivity analysis of H1-H3 (protocol 6.2) and its disagreements.

Protocol 6.2: "The Bayesian labels govern; where the frequentist sensitivity analysis
disagrees, the disagreement is reported." So this module only estimates and compares; it
never changes a label.

The model is a linear mixed model (statsmodels ``mixedlm``, REML) of Delta on the primary
model's fixed effects, built by the same code as the Bayesian model
(``primary_model.prepare``: sum-to-zero coding, centred surprisal covariates), with a
frame random intercept (the grouping) and two variance components inside each frame:

- ``unit``: the unit intercept of the primary model (its six cells share one document);
- ``frame_cell``: one intercept per frame x agent x content cell. The primary model's six
  correlated frame effects (intercept, agent, content, agent x content) span exactly the
  six cell means of a frame; statsmodels fits six correlated slopes slowly and often at
  the boundary, so the sensitivity model keeps that frame-level variation in H1-H3 with an
  exchangeable structure instead. Without it, frame-to-frame variation in H2 would be
  treated as trial noise and the intervals would be too narrow, which would manufacture
  disagreements.

Measured when this module was written (2 shared cores): 720 trials in under 0.5 s, the
confirmatory size (14,400 trials, 50 frames, 2,400 units) in about 7 s with both
components, so neither had to be dropped; both can be switched off for a comparison.
Intervals are Wald intervals from the normal approximation, as statsmodels reports for
mixed models; the fit's convergence flag and warnings travel in ``attrs``.

H1-H3 are the DECISIONS 3 contrasts: ``contrast_vectors`` pushes the design rows of the
six agent x content cells (averaged with equal weight over the band depths, every other
factor at its sum-coding zero, covariates at their centred mean) through
``primary_model.hypotheses``, the one place the contrasts are defined; being linear, the
same function turns coefficient vectors into contrast vectors.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.coding import cell_row
from fear_assets.models.primary_model import COVARIATES, hypotheses, prepare
from fear_assets.models.decision import LABELS, label

HYPOTHESES = ("H1", "H2", "H3")
# Tried in order until one converges: statsmodels' default gradient methods, then Powell
# (derivative-free), which converged in testing where they all stalled on a variance
# component at the boundary.
OPTIMISERS = ("bfgs", "lbfgs", "cg", "powell")
REQUIRED = ("delta", "agent", "content", "depth", "order", "option", "rotation", "fear", "frame", "unit")


def check_columns(data: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Fail early, naming the missing columns, rather than deep inside a formula parser."""
    missing = [c for c in columns if c not in data.columns]
    if missing:
        raise ValueError(f"{what}: the trial table lacks column(s) {missing}; it needs {list(columns)} "
                         f"(one row per trial, unmasked)")
    if data.empty:
        raise ValueError(f"{what}: the trial table is empty; pass the unmasked, non-excluded trials")


def check_band(band: Sequence, levels: Mapping[str, Sequence]) -> None:
    if len(band) == 0:
        raise ValueError("band is empty: pass the registered depth band (depth keys such as ['d3', 'd4'])")
    unknown = [d for d in band if d not in list(levels["depth"])]
    if unknown:
        raise ValueError(f"band depths {unknown} are not among the depth levels {list(levels['depth'])}")


def check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must lie in (0, 1), got {level}; pass the registered hdi_prob (0.99)")


def contrast_vectors(levels: Mapping[str, Sequence], band: Sequence, n_covariates: int,
                     extra: int = 0) -> dict[str, np.ndarray]:
    """H1-H3 as weights on [intercept, fixed effects..., ``extra`` trailing columns]: each
    cell's design row averaged over the band depths, then D3's contrasts of those rows."""
    check_band(band, levels)
    rows = {}
    for agent in levels["agent"]:
        for content in levels["content"]:
            row = np.mean([cell_row(agent, content, depth, levels, n_covariates) for depth in band], axis=0)
            rows[(agent, content)] = np.concatenate([[1.0], row, np.zeros(extra)])
    return {name: np.asarray(vector, dtype=float) for name, vector in hypotheses(rows).items()}


def wald_rows(estimates: Mapping[str, float], ses: Mapping[str, float], level: float,
              df: float | None = None) -> pd.DataFrame:
    """One row per contrast: estimate, standard error and a two-sided ``level`` interval
    (normal quantile, or Student-t with ``df`` degrees of freedom when given)."""
    from scipy import stats  # here, not at import: scipy.stats alone costs every Dagster process ~2 s

    check_level(level)
    q = stats.norm.ppf(0.5 + level / 2) if df is None else stats.t.ppf(0.5 + level / 2, df)
    out = [{"hypothesis": h, "estimate": float(estimates[h]), "se": float(ses[h]),
            "ci_low": float(estimates[h] - q * ses[h]), "ci_high": float(estimates[h] + q * ses[h])}
           for h in estimates]
    return pd.DataFrame(out, columns=["hypothesis", "estimate", "se", "ci_low", "ci_high"])


def model_table(data: pd.DataFrame, levels: Mapping[str, Sequence],
                covariates: Sequence[str] = COVARIATES) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The primary design (``prepare``) as formula-safe numeric columns x0..xk, plus
    delta, frame and unit; returns (table, column names, design names)."""
    d = prepare(data, levels, covariates=covariates)
    columns = [f"x{i}" for i in range(d.X.shape[1])]
    table = pd.DataFrame(d.X, columns=columns, index=data.index)
    table["delta"] = d.y
    table["frame"] = data["frame"].astype(str).to_numpy()
    table["unit"] = data["unit"].astype(str).to_numpy()
    table["cell"] = (data["agent"].astype(str) + "|" + data["content"].astype(str)).to_numpy()
    return table, columns, d.names


def mixed_model_contrasts(data: pd.DataFrame, levels: Mapping[str, Sequence], band: Sequence,
                          level: float, unit_component: bool = True, frame_cell_component: bool = True) -> pd.DataFrame:
    """H1-H3 from the linear mixed model, with ``level`` Wald intervals.

    Returns rows hypothesis, estimate, se, ci_low, ci_high; ``attrs`` carry the fit's
    convergence flag, its warnings and the random-effect structure, so a report can say how
    the sensitivity model differs from the primary one. A fit that does not converge is
    returned, not raised: the caller reports it beside the rows (``attrs["converged"]``)."""
    import statsmodels.formula.api as smf

    check_columns(data, (*REQUIRED, *COVARIATES), "mixed_model_contrasts")
    check_level(level)
    check_band(band, levels)
    table, columns, _ = model_table(data, levels)
    formula = "delta ~ " + " + ".join(columns)
    vc = {}
    if unit_component:
        vc["unit"] = "0 + C(unit)"
    if frame_cell_component:
        vc["frame_cell"] = "0 + C(cell)"
    # re_formula "1" must be explicit: with a vc_formula, statsmodels drops the default
    # group intercept.
    model = smf.mixedlm(formula, table, groups=table["frame"], re_formula="1", vc_formula=vc or None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = model.fit(reml=True, method=list(OPTIMISERS))
    fe_names = ["Intercept", *columns]
    beta = result.fe_params[fe_names].to_numpy()
    cov = result.cov_params().loc[fe_names, fe_names].to_numpy()
    vectors = contrast_vectors(levels, band, len(COVARIATES))
    estimates = {h: float(vectors[h] @ beta) for h in HYPOTHESES}
    ses = {h: float(np.sqrt(vectors[h] @ cov @ vectors[h])) for h in HYPOTHESES}
    out = wald_rows(estimates, ses, level)
    out.attrs.update({
        "converged": bool(result.converged),
        "warnings": sorted({str(w.message) for w in caught}),
        "random_effects": " + ".join(["frame intercept", *(f"{k} variance component" for k in vc)]),
        "n_trials": int(len(table)),
    })
    return out


def label_disagreements(bayes: Mapping[str, str], frequentist_rows: pd.DataFrame, sesoi: float) -> pd.DataFrame:
    """Label each frequentist interval with the registered rule (the interval in place of
    the HDI) and mark where it differs from the Bayesian label. Reported, never applied:
    the Bayesian label stays the one that governs (protocol 6.2)."""
    needed = {"hypothesis", "ci_low", "ci_high"}
    missing = needed - set(frequentist_rows.columns)
    if missing:
        raise ValueError(f"frequentist_rows lacks column(s) {sorted(missing)}; pass mixed_model_contrasts' output")
    out = []
    for row in frequentist_rows.itertuples(index=False):
        h = row.hypothesis
        if h not in bayes:
            raise ValueError(f"no Bayesian label for {h!r} (have {sorted(bayes)}); pass one label per hypothesis")
        if bayes[h] not in LABELS:
            raise ValueError(f"Bayesian label of {h!r} is {bayes[h]!r}; it must be one of {', '.join(LABELS)}")
        decision = label(float(row.ci_low), float(row.ci_high), sesoi)
        out.append({"hypothesis": h, "bayesian_label": bayes[h], "frequentist_label": decision.label,
                    "frequentist_meaningful": decision.practically_meaningful,
                    "disagree": decision.label != bayes[h], "governs": "bayesian",
                    "note": ("reported, not applied: the Bayesian label governs (protocol 6.2)"
                             if decision.label != bayes[h] else "")})
    return pd.DataFrame(out, columns=["hypothesis", "bayesian_label", "frequentist_label", "frequentist_meaningful",
                                      "disagree", "governs", "note"])
