"""Secondary (protocol 5): mediation of H2 by in-context attention mass, and H2 with and
without the surprisal covariates.

Attention mass is "the mean attention weight from the question tokens to the sentence"
(scored per trial as ``attention_agent`` and ``attention_partner``). Protocol 6.1 keeps it
out of the primary model because it may lie on the path by which a self-threat gains
priority; here it enters as the difference agent minus partner, centred, so that H2 is
read with the mediator at its mean:

- total: H2 without the mediator; direct: H2 with it; indirect = total - direct, which in
  OLS on the same trials equals a x b (a: H2 of the mediator, b: its coefficient);
- proportion mediated = indirect / total.

This is descriptive, not a causal mediation analysis: attention is not manipulated, and
the proportion is unstable (and may leave [0, 1]) when the total is near zero.

Both analyses use OLS on the primary fixed effects (``primary_model.prepare``, sum-to-zero
coding) with cluster-robust standard errors by frame and Student-t intervals on
(frames - 1) degrees of freedom: frame-level dependence (frames share partners and
every depth) is the dependence that matters for H2, and OLS keeps a x b = total - direct
exact, which a mixed model's shrinkage would not.

Intervals (5: secondary analyses are "reported with intervals"). The indirect effect is
total - direct, a difference of one contrast between two OLS fits on the same trials; so is
the with-minus-without-covariates comparison. Its standard error is the frame-clustered
sandwich of that difference (:func:`paired_difference`): each frame's contribution to the
first fit's contrast minus its contribution to the second's, squared and summed over frames,
with statsmodels' small-sample factor G/(G-1) (N-1)/(N-K) (K: the larger fit's columns), and
a Student-t interval on (frames - 1) degrees of freedom. It needs no random draws, so no
seed, and it keeps the two fits' dependence (they share every trial), which subtracting two
independent intervals would not. With fewer than two frames there is no frame-clustered
interval: the result says so (``NotEstimable``) instead of failing.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.frequentist import (REQUIRED, check_band, check_columns, check_level, contrast_vectors,
                                              wald_rows)
from fear_assets.models.primary_model import COVARIATES, prepare

MEDIATOR = ("attention_agent", "attention_partner")
NOTE = ("descriptive, not causal: attention mass is measured, not manipulated, so the proportion mediated "
        "describes how much of H2 moves with the attention difference; it is unstable when the total is near zero")


def ols_contrast(data: pd.DataFrame, levels: Mapping[str, Sequence], band: Sequence, level: float,
                 covariates: Sequence[str] = COVARIATES, outcome: str = "delta",
                 extra: Mapping[str, np.ndarray] | None = None, hypothesis: str = "H2") -> dict:
    """One D3 contrast from OLS with frame-clustered standard errors; ``extra`` columns
    (already centred) enter after the design and sit at zero in the contrast. Returns
    estimate, se, ci_low, ci_high, and the ``extra`` coefficients as ``coef_<name>``."""
    import statsmodels.api as sm

    check_level(level)
    check_band(band, levels)
    extra = dict(extra or {})
    d = prepare(data, levels, outcome=outcome, covariates=covariates)
    X = np.column_stack([np.ones(len(d.y)), d.X, *(np.asarray(v, dtype=float) for v in extra.values())])
    clusters = d.n_frames
    if clusters < 2:
        raise NotEstimable(f"cluster-robust errors need at least 2 frames, the data have {clusters}; "
                           "pass the trials of every confirmatory frame")
    fit = sm.OLS(d.y, X).fit(cov_type="cluster", cov_kwds={"groups": d.frame})
    vector = contrast_vectors(levels, band, len(covariates), extra=len(extra))[hypothesis]
    cov = np.asarray(fit.cov_params())
    estimate = float(vector @ fit.params)
    se = float(np.sqrt(vector @ cov @ vector))
    row = wald_rows({hypothesis: estimate}, {hypothesis: se}, level, df=clusters - 1).iloc[0]
    out = {k: float(row[k]) for k in ("estimate", "se", "ci_low", "ci_high")}
    for i, name in enumerate(extra):
        j = X.shape[1] - len(extra) + i
        out[f"coef_{name}"] = float(fit.params[j])
        out[f"se_{name}"] = float(np.sqrt(cov[j, j]))
    out["frames"] = clusters
    return out


class NotEstimable(ValueError):
    """A secondary estimand that this design cannot give with its interval (the reason is
    the message): reported as a row with that status, never as a number without interval."""


def _contrast_influence(d, covariates: Sequence[str], extra: Mapping[str, np.ndarray], levels, band,
                        hypothesis: str) -> tuple[float, np.ndarray, int]:
    """(contrast estimate, per-frame contributions to its error, number of columns) of one OLS
    fit of ``d.y`` on [1, d.X, extra]: contribution of frame g = sum over its trials of
    (X (X'X)^+ v)_i e_i, whose squares summed over frames are the cluster sandwich of v'b."""
    X = np.column_stack([np.ones(len(d.y)), d.X, *(np.asarray(v, dtype=float) for v in extra.values())])
    vector = contrast_vectors(levels, band, len(covariates), extra=len(extra))[hypothesis]
    bread = np.linalg.pinv(X.T @ X)
    params = bread @ (X.T @ d.y)
    weights = X @ (bread @ vector)
    contributions = np.zeros(d.n_frames)
    np.add.at(contributions, d.frame, weights * (d.y - X @ params))
    return float(vector @ params), contributions, X.shape[1]


def paired_difference(data: pd.DataFrame, levels: Mapping[str, Sequence], band: Sequence, level: float,
                      first: Mapping, second: Mapping, outcome: str = "delta", hypothesis: str = "H2") -> dict:
    """One contrast from fit ``first`` minus the same contrast from fit ``second``, both OLS on
    the same trials; each fit is ``{"covariates": (...), "extra": {name: centred column}}``.
    Returns estimate, se, ci_low, ci_high (frame-clustered sandwich of the difference,
    Student-t on frames - 1 df; see the module docstring) and frames. Raises NotEstimable
    with fewer than two frames."""
    check_level(level)
    check_band(band, levels)
    parts = []
    for spec in (first, second):
        covariates = tuple(spec.get("covariates", COVARIATES))
        d = prepare(data, levels, outcome=outcome, covariates=covariates)
        parts.append((d, _contrast_influence(d, covariates, dict(spec.get("extra", {})), levels, band, hypothesis)))
    (d, (est_a, u_a, k_a)), (_, (est_b, u_b, k_b)) = parts
    frames, n = d.n_frames, len(d.y)
    if frames < 2:
        raise NotEstimable(f"its frame-clustered interval needs at least 2 frames, the data have {frames}")
    correction = frames / (frames - 1) * (n - 1) / (n - max(k_a, k_b))
    se = float(np.sqrt(correction * np.sum((u_a - u_b) ** 2)))
    row = wald_rows({hypothesis: est_a - est_b}, {hypothesis: se}, level, df=frames - 1).iloc[0]
    return {**{k: float(row[k]) for k in ("estimate", "se", "ci_low", "ci_high")}, "frames": frames}


def _empty() -> dict:
    return {"estimate": math.nan, "se": math.nan, "ci_low": math.nan, "ci_high": math.nan}


def attention_mediation(data: pd.DataFrame, levels: Mapping[str, Sequence], band: Sequence, level: float) -> dict:
    """H2 total (without the attention difference), direct (with it, centred), indirect and
    the proportion mediated, on the trials that have attention mass. When attention is
    not recorded at all the total is still reported, on every trial, and the rest is NaN
    with a note saying why."""
    check_columns(data, (*REQUIRED, *COVARIATES), "attention_mediation")
    present = all(c in data.columns for c in MEDIATOR)
    complete = data[list(MEDIATOR)].notna().all(axis=1) if present else pd.Series(False, index=data.index)
    n_missing = int((~complete).sum())
    base = {"hypothesis": "H2", "level": level, "n_trials": int(complete.sum()), "n_missing_attention": n_missing,
            "note": NOTE}
    if not complete.any():
        total = ols_contrast(data, levels, band, level)
        why = ("attention columns absent" if not present else "attention mass missing on every trial")
        return {**base, "n_trials": len(data), "total": total, "direct": _empty(), "indirect": math.nan,
                "indirect_interval": _empty(), "proportion_mediated": math.nan, "a_path": _empty(),
                "b_path": math.nan, "attention_recorded": False,
                "note": f"{NOTE}. Not estimated: {why} (expected {list(MEDIATOR)} from scoring)"}
    used = data.loc[complete]
    mediator = (used["attention_agent"] - used["attention_partner"]).to_numpy(float)
    mediator = mediator - mediator.mean()
    total = ols_contrast(used, levels, band, level)
    direct = ols_contrast(used, levels, band, level, extra={"attention": mediator})
    a_path = ols_contrast(used.assign(attention_difference=mediator), levels, band, level,
                          outcome="attention_difference")
    indirect = total["estimate"] - direct["estimate"]
    # total - direct from the two fits' shared trials (module docstring: the interval)
    interval = paired_difference(used, levels, band, level, {"extra": {}}, {"extra": {"attention": mediator}})
    proportion = indirect / total["estimate"] if total["estimate"] != 0 else math.nan
    note = NOTE
    if n_missing:
        note += f"; {n_missing} trial(s) without attention mass left out of both fits so they share one sample"
    if total["ci_low"] <= 0 <= total["ci_high"]:
        note += "; the total's interval includes zero, so the proportion is not interpretable"
    return {**base, "total": total, "direct": direct, "indirect": float(indirect), "indirect_interval": interval,
            "attention_recorded": True, "proportion_mediated": float(proportion), "a_path": a_path,
            "b_path": direct["coef_attention"], "note": note}


def h2_with_without_covariates(data: pd.DataFrame, levels: Mapping[str, Sequence], band: Sequence, level: float,
                               covariates: Sequence[str] = COVARIATES) -> dict:
    """Protocol 5's comparison of H2 between models with and without the two surprisal
    covariates (same OLS machinery, same trials); a large difference says the surprisal
    matching left something that the covariates absorb."""
    check_columns(data, (*REQUIRED, *covariates), "h2_with_without_covariates")
    with_cov = ols_contrast(data, levels, band, level, covariates=covariates)
    without = ols_contrast(data, levels, band, level, covariates=())
    interval = paired_difference(data, levels, band, level, {"covariates": tuple(covariates)}, {"covariates": ()})
    return {"hypothesis": "H2", "level": level, "covariates": list(covariates), "with_covariates": with_cov,
            "without_covariates": without, "difference": with_cov["estimate"] - without["estimate"],
            "difference_interval": interval,
            "note": "secondary comparison; the primary model keeps the covariates (protocol 6.1)"}
