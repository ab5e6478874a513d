"""Simulated outcomes from the registered primary model at the pilot estimates (protocol 6.3, D7).

Every fixed effect, variance component, residual scale and nu is set at its pilot estimate
(posterior means of the pilot fit); the frame-level random-slope SDs (every frame effect but
the intercept) are multiplied by the registered inflation (1.5). The effects of interest are
then set by the scenario: the threat-minus-harmless effect of each agent is placed on the
content and agent-x-content coefficients (constant over depth; their depth interactions are
set to zero), solved from the registered contrasts themselves so that H1 = H2 = H3 = the
scenario's size (D7: at 0.30, self 0.50, peer 0.20, person 0.20).

Blocks of one dataset (D7; every analysis model the reading needs): primary Delta (H1-H3),
recall Delta (gate b), service relevance (gate a), each the primary model on its own block
with its own frame, unit and residual draws (the recall block at the pilot's recall fit, its
own residual scale, where the pilot scored recall: ``gate_b_estimates``); the blocks of ``models`` (controls 2-4 in one
joint fit with the matched primary cells, sharing the primary block's frame effects plus their own
per-frame agent x content deviations, as the joint model has them; the
addressee control on its own cells; gate (c)'s judge block; H4's probe log-odds; H5's forced
choices). Controls carry their pilot estimates, not the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from fear_assets.models.primary_model import COVARIATES, PrimaryData, cell_means, hypotheses, posterior_draws
from fear_assets.core.sections import SCENARIOS

AGENT_ORDER = ("self", "peer", "person")

#: Blocks of one simulated dataset: name -> what it tests (the name is kept from the release
#: that fitted only primary-model blocks; the asset layer reads it as the list of blocks).
PRIMARY_MODEL_BLOCKS = {
    "primary": "H1-H3 on Delta",
    "recall": "gate (b): H2 on the recall branch",
    "service_relevance": "gate (a): H2 in the service-relevance condition",
    "control_instructed_interaction": "positive control 2 (pilot estimate), joint fit with the primary cells",
    "control_instructed_priority": "positive control 3 (pilot estimate), joint fit with the primary cells",
    "control_marked_priority": "positive control 4 (pilot estimate), joint fit with the primary cells",
    "control_addressee_name": "positive control 1 (pilot estimate), its own cells",
    "judge": "gate (c): the joint tested/judge model",
    "probe": "H4: the primary model on probe log-odds",
    "forced_choice": "H5: the hierarchical probit at the H5 depth",
}
#: Blocks with no generator in this release (none since every analysis model is simulated);
#: a block whose pilot estimates are missing is listed by ``runner.not_simulated``.
NOT_SIMULATED: dict[str, str] = {}


@dataclass(frozen=True)
class PilotEstimates:
    """Posterior means of the pilot's primary fit: what 6.3 calls the pilot estimates."""

    intercept: float
    beta: Mapping[str, float]
    frame_sd: tuple[float, ...]
    frame_corr: tuple[tuple[float, ...], ...]
    unit_sd: float
    sigma: float
    nu: float
    covariate_sd: tuple[float, ...]
    #: Pilot contrasts of the positive controls simulated here (control name -> mean).
    controls: Mapping[str, float]
    #: H4's pilot estimates on the log-odds scale (an ``as_dict`` of the pilot H4 fit's
    #: estimates plus ``document_sd``); None: H4 is not simulated (no pilot probe fit).
    h4: Mapping | None = None
    #: H5's pilot estimates (``models.H5Estimates.as_dict``); None: H5 is not simulated.
    h5: Mapping | None = None
    #: The judge's pilot residual SD (gate (c)'s judge scale); None: the tested model's.
    judge_sigma: float | None = None
    #: Gate (b)'s pilot estimates: an ``as_dict`` of the registered primary model fitted on the
    #: pilot's recall Delta (its own fixed effects, frame and unit SDs, sigma and nu); None: the
    #: pilot scored no recall, and gate (b) is generated from the report fit (``gate_b_estimates``).
    recall: Mapping | None = None
    #: The registered H5 depth the pilot's depth rule fixed (5; ``pilot_depths``), where H5's
    #: forced choices are simulated; None: not recorded (the band's deepest depth stands in).
    h5_depth: str | None = None

    def as_dict(self) -> dict:
        out = {"intercept": self.intercept, "beta": dict(self.beta), "frame_sd": list(self.frame_sd),
               "frame_corr": [list(r) for r in self.frame_corr], "unit_sd": self.unit_sd, "sigma": self.sigma,
               "nu": self.nu, "covariate_sd": list(self.covariate_sd), "controls": dict(self.controls)}
        for key in ("h4", "h5", "judge_sigma", "recall"):  # absent keys keep earlier stored estimates byte-identical
            if getattr(self, key) is not None:
                out[key] = dict(getattr(self, key)) if key != "judge_sigma" else float(self.judge_sigma)
        if self.h5_depth is not None:
            out["h5_depth"] = str(self.h5_depth)
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "PilotEstimates":
        return cls(float(d["intercept"]), {k: float(v) for k, v in d["beta"].items()},
                   tuple(float(x) for x in d["frame_sd"]), tuple(tuple(float(x) for x in r) for r in d["frame_corr"]),
                   float(d["unit_sd"]), float(d["sigma"]), float(d["nu"]),
                   tuple(float(x) for x in d["covariate_sd"]), {k: float(v) for k, v in d["controls"].items()},
                   d.get("h4"), d.get("h5"), None if d.get("judge_sigma") is None else float(d["judge_sigma"]),
                   d.get("recall"), d.get("h5_depth"))


def gate_b_estimates(est: PilotEstimates) -> PilotEstimates:
    """The estimates gate (b)'s recall block is generated from (6.3: every parameter at its
    pilot estimate): the pilot's recall fit (``est.recall``), with its own residual scale,
    nu, frame and unit SDs and fixed effects; the report fit ``est`` itself where the pilot
    scored no recall (``power_pilot_estimates`` says so)."""
    return est if est.recall is None else PilotEstimates.from_dict(est.recall)


def pilot_estimates(idata, data: PrimaryData, controls: Mapping[str, float]) -> PilotEstimates:
    """Pilot estimates from the pilot's primary posterior (``idata``) and its model inputs."""
    mean = lambda name: posterior_draws(idata, name).mean(axis=0)
    beta = dict(zip(data.names, (float(x) for x in mean("beta"))))
    cov_cols = [data.names.index(c) for c in COVARIATES if c in data.names]
    cov_sd = tuple(float(data.X[:, i].std()) for i in cov_cols) or (0.0, 0.0)
    corr = mean("frame_chol_corr")
    return PilotEstimates(float(mean("intercept")), beta, tuple(float(x) for x in mean("frame_chol_stds")),
                          tuple(tuple(float(x) for x in r) for r in corr), float(mean("unit_sd")),
                          float(mean("sigma")), float(mean("nu")), cov_sd, dict(controls))


def scenario_size(scenario: str, decision: Mapping) -> float:
    """D7: the effect size every hypothesis and gate takes in a scenario."""
    sizes = {"meaningful": float(decision["meaningful"]), "null": 0.0, "sesoi": float(decision["sesoi"])}
    if scenario not in sizes:
        raise ValueError(f"unknown scenario {scenario!r}: use one of {', '.join(SCENARIOS)} (D7)")
    return sizes[scenario]


def agent_effects(size: float) -> dict[str, float]:
    """Threat-minus-harmless effect per agent with H1 = H2 = H3 = ``size`` (D3's definitions:
    H1 = mean of the three, H2 = self - peer, H3 = self - person), solved, not hard-coded."""
    unit = {a: np.eye(3)[i] for i, a in enumerate(AGENT_ORDER)}
    mu = {(a, c): (unit[a] if c == "threat" else np.zeros(3)) for a in AGENT_ORDER for c in ("threat", "harmless")}
    h = hypotheses(mu)
    A = np.stack([h["H1"], h["H2"], h["H3"]])
    solution = np.linalg.solve(A, np.full(3, size))
    return dict(zip(AGENT_ORDER, (float(x) for x in solution)))


def block_effects(block: str, size: float, controls: Mapping[str, float]) -> tuple[dict[str, float], float]:
    """(threat-minus-harmless per agent, shift of every cell) of one block in a scenario."""
    effects = agent_effects(size)
    if block in ("primary", "recall", "service_relevance"):
        return effects, 0.0
    if block == "control_instructed_interaction":
        # ([peer T - H] - [person T - H]) in the control minus the same in primary = the estimate.
        return {**effects, "peer": effects["peer"] + controls["instructed_interaction"]}, 0.0
    if block in ("control_instructed_priority", "control_marked_priority"):
        # Delta(control) - Delta(primary), all cells = the estimate.
        return effects, controls[block.removeprefix("control_")]
    raise ValueError(f"unknown simulated block {block!r}: use one of {', '.join(PRIMARY_MODEL_BLOCKS)}")


def true_beta(est: PilotEstimates, d: PrimaryData, band: Sequence[str], effects: Mapping[str, float]) -> np.ndarray:
    """Fixed effects: the pilot's, with every content-involving coefficient replaced so that
    each agent's band-averaged threat-minus-harmless effect is ``effects[agent]`` at every depth."""
    beta = np.array([est.beta.get(n, 0.0) for n in d.names])  # a level the pilot lacked: 0
    content_cols = [i for i, n in enumerate(d.names) if "content[" in n]
    beta[content_cols] = 0.0
    free = [d.names.index(n) for n in ("content[threat]", "agent[self]:content[threat]",
                                       "agent[peer]:content[threat]")]
    p = len(d.names)
    mu = cell_means(d, np.eye(p), np.zeros(p), list(band))
    W = np.stack([mu[(a, "threat")] - mu[(a, "harmless")] for a in AGENT_ORDER])
    beta[free] = np.linalg.solve(W[:, free], np.array([effects[a] for a in AGENT_ORDER]))
    return beta


def frame_covariance(est: PilotEstimates, inflation: float) -> np.ndarray:
    """Frame-effect covariance with the random-slope SDs (all but the intercept) inflated."""
    sd = np.array(est.frame_sd, dtype=float)
    sd[1:] *= inflation
    return np.outer(sd, sd) * np.array(est.frame_corr, dtype=float)


def draw_frame_effects(est: PilotEstimates, inflation: float, n_frames: int, rng: np.random.Generator,
                       n_effects: int | None = None) -> np.ndarray:
    """Frame effects (frames x effects) at the pilot's covariance, slopes inflated; the first
    ``n_effects`` of them where a design has fewer agents (the addressee control: four)."""
    cov = frame_covariance(est, inflation)
    k = len(cov) if n_effects is None else int(n_effects)
    return rng.multivariate_normal(np.zeros(k), cov[:k, :k], size=n_frames, method="cholesky")


def block_deviation_covariance(est: PilotEstimates, inflation: float, columns: Sequence[int]) -> np.ndarray:
    """Covariance of a second block's own frame deviations on the frame-effect ``columns``
    (the joint model's contrast terms, ``analysis.joint.deviation_columns``): the pilot's
    frame covariance of those slopes, SDs x the inflation. Reading taken: the pilot fits no
    per-block deviation, and 6.3 sets every variance component at its pilot estimate with the
    random-slope SDs inflated, so a block's slopes vary about the primary block's by as much as
    the primary block's vary between frames, the nearest pilot estimate of that spread."""
    cov = frame_covariance(est, inflation)
    return cov[np.ix_(list(columns), list(columns))]


def with_block_deviations(frames: np.ndarray, columns: Sequence[int], cov: np.ndarray,
                          rng: np.random.Generator) -> np.ndarray:
    """Another block's frame effects: ``frames`` (frames x effects, the block it is paired with)
    plus its own per-frame deviations ~ MvNormal(0, ``cov``) on ``columns``, zero elsewhere."""
    cov = np.atleast_2d(np.asarray(cov, dtype=float))
    out = np.array(frames, dtype=float, copy=True)
    out[:, list(columns)] += rng.multivariate_normal(np.zeros(len(cov)), cov, size=len(out), method="cholesky")
    return out


def simulate_block(d: PrimaryData, est: PilotEstimates, beta: np.ndarray, shift: float, inflation: float,
                   rng: np.random.Generator, frames: np.ndarray | None = None) -> PrimaryData:
    """One block's outcomes on the fixed design ``d`` (only ``y`` differs). ``frames``: frame
    effects shared with another block of the same dataset (the joint two-block model's
    structure: a frame's effects are the same in both blocks); drawn here when None."""
    if frames is None:
        frames = draw_frame_effects(est, inflation, d.n_frames, rng, d.Z.shape[1])
    units = rng.normal(0.0, est.unit_sd, size=d.n_units)
    mean = est.intercept + shift + d.X @ beta + (d.Z * frames[d.frame]).sum(axis=1) + units[d.unit]
    y = mean + est.sigma * rng.standard_t(est.nu, size=len(mean))
    return replace(d, y=y)
