"""Positive controls (protocol 4.6, D4): contrasts signed so the predicted direction is
positive, from the primary model fitted on the control cells against the matched primary
cells, averaged over the depth band; a control passes if its posterior mean is at least the
SESOI and its 99% HDI lies wholly above zero.

"Control contrasts are fitted with the primary model on the control cells against the
matched primary cells" (4.6): controls 2-4 are one fit of ``analysis.joint``'s two-block
model over the control block and the matched primary cells (the primary block's trials on
the same frames and depths), with a condition factor (control vs primary, sum-coded,
Normal(0, fixed_effect_sd) like every fixed effect) and its interactions with agent x content
x depth, and the primary model's frame effects shared by both blocks, so a frame's effects
are paired across the blocks rather than entering twice as independent noise, plus the
condition factor's own frame deviations of the agent x content slopes (``joint``: a frame
may carry the instructed interaction more in the control than in the primary cells, and
that variation widens the contrast's HDI instead of entering the residual; LKJ(2) and
half-Normal(0, 0.5) scales, the registered random-effect priors). The contrast is read from
that one posterior, draw by draw.

Control 1 (addressee's own name) is the one exception, a reading taken: its contrast,
Delta(addressee) - Delta(other person), lies wholly within the control cells (D4 1), and its
agents (the addressee and an uninvolved person) never occur in the primary cells, so no
primary cell is matched to them and none enters the contrast; it is the primary model fitted
to its own block. Its agent sentences have no registered document-independent surprisal
(4.3 measures the self, peer and person sentences), so that fit has no surprisal covariates,
declared here rather than dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.data import AGENTS, levels_of, prepared
from fear_assets.models.joint import block_cell_means, prepare_joint
from fear_assets.models.primary_model import cell_means, check_band, convergence, posterior_draws

#: D4's four controls: name -> (control block suffix, kind of contrast).
CONTROLS = {
    "addressee_name": "control_addressee_name",
    "instructed_interaction": "control_instructed_interaction",
    "instructed_priority": "control_instructed_priority",
    "marked_priority": "control_marked_priority",
}

CellMeans = Mapping[tuple[str, str], np.ndarray]


def _effect(mu: CellMeans, agent: str) -> np.ndarray:
    return mu[(agent, "threat")] - mu[(agent, "harmless")]


def _all_cells(mu: CellMeans) -> np.ndarray:
    return np.mean(list(mu.values()), axis=0)


def addressee_contrast(control: CellMeans) -> np.ndarray:
    """1. Delta(addressee) - Delta(other person), over both contents."""
    return (np.mean([control[("addressee", c)] for c in ("threat", "harmless")], axis=0)
            - np.mean([control[("other_person", c)] for c in ("threat", "harmless")], axis=0))


def instructed_interaction_contrast(control: CellMeans, primary: CellMeans) -> np.ndarray:
    """2. ([peer T - peer H] - [person T - person H]) in the control minus the same in primary."""
    return ((_effect(control, "peer") - _effect(control, "person"))
            - (_effect(primary, "peer") - _effect(primary, "person")))


def priority_contrast(control: CellMeans, primary: CellMeans) -> np.ndarray:
    """3 and 4. Delta(control) - Delta(primary), all cells."""
    return _all_cells(control) - _all_cells(primary)


CONTRASTS: dict[str, Callable[..., np.ndarray]] = {
    "addressee_name": lambda control, primary: addressee_contrast(control),
    "instructed_interaction": instructed_interaction_contrast,
    "instructed_priority": priority_contrast,
    "marked_priority": priority_contrast,
}


@dataclass(frozen=True)
class ControlVerdict:
    control: str
    mean: float
    hdi_low: float
    hdi_high: float
    passed: bool
    reason: str


def control_verdict(name: str, draws: np.ndarray, hdi_prob: float, min_mean: float, hdi_above: float) -> ControlVerdict:
    """D4's pass rule: posterior mean >= ``min_mean`` (the SESOI) and the HDI wholly above
    ``hdi_above`` (zero)."""
    import arviz as az

    low, high = (float(x) for x in az.hdi(np.asarray(draws), hdi_prob=hdi_prob))
    mean = float(np.mean(draws))
    problems = []
    if mean < min_mean:
        problems.append(f"posterior mean {mean:.3f} < {min_mean}")
    if low <= hdi_above:
        problems.append(f"{hdi_prob:.0%} HDI [{low:.3f}, {high:.3f}] not wholly above {hdi_above}")
    return ControlVerdict(name, mean, low, high, not problems, "; ".join(problems) or "passes")


def verdict_rows(verdicts: Sequence[ControlVerdict]) -> list[dict]:
    return [v.__dict__.copy() for v in verdicts]


#: The addressee control's two agents (D4 1): its own cells only.
ADDRESSEE_AGENTS = ("addressee", "other_person")


@dataclass
class ControlFit:
    """One control's fit: the contrast's draws, the rows fitted, the chains and diagnostics,
    and the fit's InferenceData (saved beside the estimands)."""

    name: str
    draws: np.ndarray
    rows: int
    chains: int
    diagnostics: dict
    idata: object = field(default=None, repr=False)


def matched_primary(control: pd.DataFrame, primary: pd.DataFrame) -> pd.DataFrame:
    """The primary cells matched to a control block: the primary trials on the control's
    frames and depths (same rotations, orders and cells by design)."""
    keys = control[["frame", "depth"]].drop_duplicates()
    return primary.merge(keys, on=["frame", "depth"], how="inner")


def control_data(name: str, control: pd.DataFrame, primary: pd.DataFrame, fears: Sequence[str], fixed_sd: float):
    """The data of control ``name``'s registered fit (see the module docstring): the addressee
    control's own cells (``PrimaryData``, no covariates), or the control block with its matched
    primary cells in the joint model (``JointData``, condition factor at ``fixed_sd``).
    ``control`` and ``primary`` are model tables (``data.model_table``)."""
    if control.empty:
        raise ValueError(f"control {name}: no rows to fit; score its block first")
    if name == "addressee_name":
        return prepared(control, levels_of(control, fears, ADDRESSEE_AGENTS), covariates=())
    matched = matched_primary(control, primary)
    if matched.empty:
        raise ValueError(f"control {name}: no primary trial on its frames and depths; score the primary block there")
    data = pd.concat([control.assign(condition="control"), matched.assign(condition="primary")], ignore_index=True)
    return prepare_joint(data, levels_of(data, fears, AGENTS), "condition", ("control", "primary"), fixed_sd,
                         per_block_sigma=False)


def control_contrast(name: str, idata, d, band: Sequence[str]) -> np.ndarray:
    """D4's contrast of control ``name``: draws from a posterior of its registered fit of
    ``d`` (:func:`control_data`), cell means averaged over the band depths."""
    if name == "addressee_name":
        mu = cell_means(d, posterior_draws(idata, "beta"), posterior_draws(idata, "intercept"),
                        check_band(band, d.levels["depth"], f"control {name}"))
        return CONTRASTS[name](mu, None)
    mu = block_cell_means(idata, d, band)
    return CONTRASTS[name](mu["control"], mu["primary"])


def fit_control(fitter, name: str, control: pd.DataFrame, primary: pd.DataFrame, fears: Sequence[str],
                band: Sequence[str], seed: int) -> ControlFit:
    """D4's contrast of control ``name`` from its registered fit (see the module docstring).
    ``control`` and ``primary`` are model tables (``data.model_table``)."""

    d = control_data(name, control, primary, fears, fitter.priors.fixed_sd)
    idata = fitter.fit(d, seed)
    draws = control_contrast(name, idata, d, band)
    if name == "addressee_name":
        return ControlFit(name, draws, len(control), int(idata.posterior.sizes["chain"]), convergence(idata), idata)
    return ControlFit(name, draws, len(d.y), int(idata.posterior.sizes["chain"]),
                      convergence(idata, ("intercept", "beta", "block_beta", "sigma", "nu")), idata)


def pilot_control_rows(fitter, control_table: Callable[[str], pd.DataFrame], primary: pd.DataFrame,
                       fears: Sequence[str], band: Sequence[str], seed: Callable[[str], int], hdi_prob: float,
                       min_mean: float, hdi_above: float, log: Callable[[str], None] = lambda _: None) -> list[dict]:
    """4.6 / D4 in the pilot: one row per positive control (``CONTROLS``), its band-averaged
    contrast fitted with the matched primary cells, and its verdict ("posterior mean >= 0.15
    and 99% HDI wholly above zero"); a control whose block has no rows at the band depths
    is not scored and does not pass. ``control_table(block)`` gives a block's model table."""
    rows = []
    for name, suffix in CONTROLS.items():
        data = control_table(f"pilot_{suffix}")
        if data.empty:
            rows.append({"control": name, "mean": float("nan"), "hdi_low": float("nan"), "hdi_high": float("nan"),
                         "passed": False, "reason": f"not scored: block pilot_{suffix} has no rows at the band depths"})
            continue
        fit = fit_control(fitter, name, data, primary, fears, band, seed(name))
        verdict = control_verdict(name, fit.draws, hdi_prob, min_mean, hdi_above)
        rows.append({**verdict.__dict__, "trials": fit.rows, "max_rhat": fit.diagnostics["max_rhat"],
                     "divergences": fit.diagnostics["divergences"]})
        log(f"control {name}: mean {verdict.mean:.3f}, HDI [{verdict.hdi_low:.3f}, "
            f"{verdict.hdi_high:.3f}] -> {'pass' if verdict.passed else 'FAIL'}")
    return rows
