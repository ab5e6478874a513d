"""The registered primary model (protocol 6.1, D3b) and the H1-H3 contrasts (D3).

Delta ~ Student-t(nu, mu, sigma), nu ~ Gamma(2, 0.1), sigma ~ half-Normal(0, 0.5);
mu = intercept + fixed effects (agent x content x depth with all interactions, order,
content option, rotation, fear class, the two centred surprisal covariates; Normal(0, 0.5)
each, sum-to-zero coding) + frame effects (intercept, agent, content, agent x content:
six correlated effects, LKJ(2), half-Normal(0, 0.5) scales; non-centred through the
Cholesky factor or centred on the fixed effects they vary about, either of which leaves the
joint prior unchanged) + a unit intercept
(half-Normal(0, 0.5) scale, non-centred). Sampled with nutpie (PyMC's NUTS as fallback).

mu is evaluated per distinct design row (:func:`design_cells`): a registered-size table has
14,400 trials but 1,440 distinct rows of the design apart from its two continuous covariates,
and 6 distinct frame-slope rows, so the fixed part is computed once per row pattern and the
frame part once per (frame, slope pattern), then gathered per trial. The same mu to rounding,
with a gradient 5-6.5x cheaper at registered size (``benchmarks/gradient.py``); ``predictor=
"direct"`` keeps the row-by-row form (the with_data baseline of the benchmark).

The design's data containers (:func:`design_data`, row by row or per distinct row), the fixed
part (:func:`fixed_part`), the random-effects structure (:func:`frame_and_unit_effects`) and the
Student-t residual (:func:`student_t_residual`) are the building blocks that the joint two-block models (gate
(c)'s reader factor, the positive controls' condition factor: ``analysis/joint.py``) reuse,
so there is one copy of them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.models.coding import cell_row, design, frame_slopes
from fear_assets.models.parametrisation import frame_parametrisation
from fear_assets.core.registered import Registered

COVARIATES = ("surprisal_name", "surprisal_rest")


class MissingCovariateError(ValueError):
    """A trial lacks a registered surprisal covariate (6.1). The covariates are never dropped
    from a fit to get round it: the message names the column, the rows and the fix."""


class MissingBandDepthError(ValueError):
    """A registered band depth has no data: averaging over the depths that happen to be
    present would be a different estimand (5: equal weight over the registered band)."""


def check_band(band: Sequence, depths: Sequence, what: str = "the fit") -> list:
    """The band as given, if every depth of it is in ``depths``; else MissingBandDepthError."""
    band = list(band)
    if not band:
        raise MissingBandDepthError(f"{what}: the depth band is empty; pass the registered band (e.g. ['d3', 'd4'])")
    missing = [b for b in band if b not in list(depths)]
    if missing:
        raise MissingBandDepthError(
            f"{what}: band depth(s) {missing} have no rows (depths present: {list(depths)}); the band average "
            f"needs every registered band depth: score those depth partitions first")
    return band


def check_covariates(data: pd.DataFrame, covariates: Sequence[str], what: str = "the model table") -> None:
    """MissingCovariateError if a covariate column is absent or missing on any row."""
    for cov in covariates:
        if cov not in data.columns:
            raise MissingCovariateError(f"{what} has no column {cov!r}: build it with analysis.data.model_table "
                                        f"(the surprisal covariates of 6.1)")
        bad = data[cov].isna()
        if bad.any():
            sample = data.loc[bad, [c for c in ("item_id", "frame", "rotation", "agent", "content", "option")
                                    if c in data.columns]].head(3).to_dict("records")
            raise MissingCovariateError(
                f"{what}: covariate {cov!r} is missing on {int(bad.sum())} of {len(data)} rows (e.g. {sample}): "
                f"materialise sentence_surprisal for every frame, rotation, agent, content and option of these "
                f"trials (or pass covariates=() where the registered design has none, as for the addressee control)")


@dataclass(frozen=True)
class Priors:
    fixed_sd: float
    intercept_sd: float
    group_sd: float
    residual_sd: float
    nu_alpha: float
    nu_beta: float
    lkj_eta: float

    @classmethod
    def from_settings(cls, settings, fixed_sd: float | None = None) -> "Priors":
        p = settings.priors
        alpha, beta = p.student_t_nu_gamma
        return cls(float(fixed_sd if fixed_sd is not None else p.fixed_effect_sd), p.intercept_sd,
                   p.group_sd_halfnormal, p.residual_sd_halfnormal, alpha, beta, p.lkj_eta)


@dataclass
class PrimaryData:
    """Model inputs built once from a trial-level table (one row per trial)."""

    y: np.ndarray
    X: np.ndarray
    names: list[str]
    Z: np.ndarray
    frame: np.ndarray
    unit: np.ndarray
    levels: Mapping[str, Sequence]
    n_frames: int
    n_units: int
    covariates: tuple[str, ...] = field(default=COVARIATES)
    document: np.ndarray | None = None  # H4: both content versions of a document share it
    n_documents: int = 0


def prepare(data: pd.DataFrame, levels: Mapping[str, Sequence], outcome: str = "delta",
            covariates: Sequence[str] = COVARIATES, document: str | None = None) -> PrimaryData:
    """``data`` columns: outcome, agent, content, depth, order, option, rotation, fear, frame,
    unit and the covariates, already centred on their bank means (D3b; ``data.model_table``
    does it). They are not re-centred here: centring on the fitted rows' mean would move the
    reference point with every subset (a control block, a flagged-cell refit). A missing
    covariate raises MissingCovariateError."""
    check_covariates(data, covariates)
    X, names = design(data, levels, covariates)
    frames, frame_idx = np.unique(data["frame"], return_inverse=True)
    units, unit_idx = np.unique(data["unit"], return_inverse=True)
    doc_idx, n_docs = None, 0
    if document is not None:
        docs, doc_idx = np.unique(data[document], return_inverse=True)
        n_docs = len(docs)
    return PrimaryData(data[outcome].to_numpy(float), X, names, frame_slopes(data, levels), frame_idx, unit_idx,
                       levels, len(frames), len(units), tuple(covariates), doc_idx, n_docs)


FRAME_EFFECTS = {6: ["intercept", "agent1", "agent2", "content", "agent1:content", "agent2:content"],
                 4: ["intercept", "agent1", "content", "agent1:content"]}


#: How the frame effects are sampled (D3b: both leave the joint prior as registered).
#: non_centred: z @ chol.T with z ~ Normal(0, 1), which mixes where a frame's data say little
#: (few rows per frame, a scale near zero). centred: each frame's effects drawn around the fixed
#: effects they vary about, MvNormal(means, chol) (hierarchical centring), which mixes where a
#: frame's data say much (registered size: 288 rows a frame; benchmarks/reparam.py).
FRAME_PARAMETRISATIONS = ("non_centred", "centred")

#: How mu is evaluated (the same model, the same mu to rounding): "cells", once per distinct
#: design row and gathered per trial (:func:`design_cells`), or "direct", row by row (X @ beta and
#: each trial's frame slopes; a dense product over the whole table and a scatter of every
#: trial's gradient back onto its frame, which dominated a registered-size gradient).
PREDICTORS = ("cells", "direct")


@dataclass(frozen=True)
class DesignCells:
    """The design stored by its distinct rows: trial i's fixed part is
    ``X_cells[cell[i]] @ beta + X_covariates[i] @ beta[covariate_columns]`` and its frame part
    ``(frame_effects @ Z_patterns.T).ravel()[frame_pattern[i]]`` (= ``Z[i] @ frame_effects[frame[i]]``)."""

    X_cells: np.ndarray  # distinct rows of X with the covariate columns set to zero
    cell: np.ndarray  # trial -> row of X_cells
    X_covariates: np.ndarray  # trials x covariates: the continuous columns, kept per trial
    covariate_columns: tuple[int, ...]
    Z_patterns: np.ndarray  # distinct rows of Z
    frame_pattern: np.ndarray  # trial -> frame * len(Z_patterns) + its row of Z_patterns


def design_cells(X: np.ndarray, Z: np.ndarray, frame: np.ndarray, covariate_columns: Sequence[int]) -> DesignCells:
    """:class:`DesignCells` of a design (X, Z, frame) whose ``covariate_columns`` of X are
    continuous (kept per trial). Pure and deterministic (``np.unique`` sorts the rows), so the
    same design gives the same cells."""
    columns = tuple(int(c) for c in covariate_columns)
    discrete = X.copy()
    discrete[:, list(columns)] = 0.0
    X_cells, cell = np.unique(discrete, axis=0, return_inverse=True)
    Z_patterns, pattern = np.unique(Z, axis=0, return_inverse=True)
    return DesignCells(X_cells, cell.reshape(-1).astype(np.int64), X[:, list(columns)], columns, Z_patterns,
                       frame.astype(np.int64) * len(Z_patterns) + pattern.reshape(-1).astype(np.int64))


def covariate_columns(names: Sequence[str], covariates: Sequence[str]) -> tuple[int, ...]:
    """Where the continuous covariates sit among the design's columns."""
    return tuple(list(names).index(c) for c in covariates if c in names)


def primary_cells(d: PrimaryData) -> DesignCells:
    """:func:`design_cells` of the primary model's data."""
    return design_cells(d.X, d.Z, d.frame, covariate_columns(d.names, d.covariates))


def check_choice(name: str, value: str, allowed: Sequence[str], owner: str = "") -> None:
    """Validate a form parameter where it is declared; the error names the allowed values."""
    if value not in allowed:
        where = f"{owner}({name}={value!r})" if owner else f"{name}={value!r}"
        raise ValueError(f"{where}: use one of {list(allowed)}")


def cells_data(c: DesignCells) -> dict[str, np.ndarray]:
    """The design's data containers of a cells design (the model adds ``y`` and ``unit``)."""
    out = {"X_cells": c.X_cells, "cell": c.cell, "Z_patterns": c.Z_patterns, "frame_pattern": c.frame_pattern}
    if c.covariate_columns:
        out["X_covariates"] = c.X_covariates
    return out


def design_data(X: np.ndarray, Z: np.ndarray, frame: np.ndarray, columns: Sequence[int],
                predictor: str) -> dict[str, np.ndarray]:
    """The design's data containers for ``predictor`` (``PREDICTORS``): X, Z and frame row by
    row ("direct"), or their :func:`design_cells` ("cells"). ``columns``: X's continuous
    covariate columns. The primary and joint models both store their design through this."""
    check_choice("predictor", predictor, PREDICTORS)
    if predictor == "direct":
        return {"X": X, "Z": Z, "frame": frame.astype("int64")}
    return cells_data(design_cells(X, Z, frame, columns))


def fixed_part(design: Mapping, intercept, coefficients, columns: Sequence[int]):
    """intercept + X @ coefficients, inside a model context, from the containers of
    :func:`design_data`: row by row (``X``) or once per distinct row and gathered per trial
    (``X_cells``, ``cell``; the ``columns`` of continuous covariates per trial): the same values."""
    import pymc as pm

    if "X" in design:
        return intercept + pm.math.dot(design["X"], coefficients)
    fixed = (intercept + pm.math.dot(design["X_cells"], coefficients))[design["cell"]]
    if columns:
        fixed = fixed + pm.math.dot(design["X_covariates"], coefficients[list(columns)])
    return fixed


@dataclass(frozen=True)
class FrameCentring:
    """What each of the k frame effects is centred on: ``slopes[j]`` is the fixed-effect column
    equal to frame-effect column j (None: centred on zero, or the intercept for a column of
    ones); the frame intercept's centre is the model intercept plus ``levels @ beta[level_columns]``
    (fixed effects constant within every frame, such as the fear class)."""

    slopes: tuple[int | None, ...]
    intercept_column: int | None
    level_columns: tuple[int, ...]
    levels: np.ndarray  # n_frames x len(level_columns)


def frame_centring(X: np.ndarray, Z: np.ndarray, frame: np.ndarray, n_frames: int) -> FrameCentring:
    """Read the centring off the design: a frame-effect column equal to a fixed-effect column
    is centred on that coefficient; the column of ones on the intercept and the fixed effects
    that do not vary within any frame (a frame's fear class). Pure; the same design gives the
    same centring."""
    ones = [j for j in range(Z.shape[1]) if np.all(Z[:, j] == 1.0)]
    slopes = tuple(None if j in ones else next((c for c in range(X.shape[1]) if np.array_equal(X[:, c], Z[:, j])), None)
                   for j in range(Z.shape[1]))
    level_columns, levels = [], np.zeros((n_frames, 0))
    if ones:
        first = np.array([np.flatnonzero(frame == f)[0] for f in range(n_frames)])
        constant = np.all(X == X[first][frame], axis=0) & ~np.all(X == X[0], axis=0)
        level_columns = [int(c) for c in np.flatnonzero(constant)]
        levels = X[first][:, level_columns]
    return FrameCentring(slopes, ones[0] if ones else None, tuple(level_columns), levels)


def frame_means(centring: FrameCentring, intercept, beta, n_frames: int):
    """n_frames x k: the fixed-effect values each frame's effects are centred on (a PyTensor
    expression of ``intercept`` and ``beta``)."""
    import pytensor.tensor as pt

    columns = []
    for j, c in enumerate(centring.slopes):
        if j == centring.intercept_column:
            m = intercept + (pt.dot(centring.levels, beta[list(centring.level_columns)]) if centring.level_columns
                             else pt.zeros(n_frames))
        else:
            m = pt.zeros(n_frames) + (beta[c] if c is not None else 0.0)
        columns.append(m)
    return pt.stack(columns, axis=1)


def frame_and_unit_effects(design: Mapping, n_frames: int, n_effects: int, n_units: int, priors: Priors,
                           means=None):
    """The registered random effects' contribution to mu (6.1, D3b), inside a model context:
    per frame, ``n_effects`` correlated effects (intercept, agent, content, agent x content:
    six) with an LKJ(eta) correlation prior and half-Normal(group_sd) scales (``frame_chol``,
    ``frame_effects``); plus a unit intercept with a half-Normal(group_sd) scale (``unit_sd``,
    ``z_unit``). The frame effects are non-centred through the Cholesky factor (``z_frame``)
    or, given ``means`` (:func:`frame_means`), sampled centred on them (``frame_centred``):
    frame_effects = frame_centred - means, the same joint prior either way. ``design``: the
    containers of :func:`design_data` and ``unit``; each trial's frame part is
    ``Z[i] @ frame_effects[frame[i]]`` row by row (``Z``, ``frame``), or each frame's product with
    its distinct slope rows gathered per trial (``Z_patterns``, ``frame_pattern``): the same sum."""
    import pymc as pm

    chol, _, _ = pm.LKJCholeskyCov("frame_chol", n=n_effects, eta=priors.lkj_eta,
                                   sd_dist=pm.HalfNormal.dist(priors.group_sd), compute_corr=True)
    if means is None:
        z_frame = pm.Normal("z_frame", 0.0, 1.0, shape=(n_frames, n_effects))
        frame_effects = pm.Deterministic("frame_effects", z_frame @ chol.T)
    else:
        centred = pm.MvNormal("frame_centred", mu=means, chol=chol, shape=(n_frames, n_effects))
        frame_effects = pm.Deterministic("frame_effects", centred - means)
    unit_sd = pm.HalfNormal("unit_sd", priors.group_sd)
    z_unit = pm.Normal("z_unit", 0.0, 1.0, shape=n_units)
    if "Z" in design:
        frame_part = (design["Z"] * frame_effects[design["frame"]]).sum(axis=1)
    else:
        frame_part = pm.math.dot(frame_effects, design["Z_patterns"].T).reshape((-1,))[design["frame_pattern"]]
    return frame_part + unit_sd * z_unit[design["unit"]]


def student_t_residual(priors: Priors, dims: str | None = None):
    """(sigma, nu): the residual scale(s), half-Normal(residual_sd) (one per level of ``dims``
    where given: gate (c)'s reader-specific scales), and nu ~ Gamma(alpha, beta) (6.1)."""
    import pymc as pm

    sigma = pm.HalfNormal("sigma", priors.residual_sd, dims=dims) if dims else pm.HalfNormal("sigma", priors.residual_sd)
    nu = pm.Gamma("nu", alpha=priors.nu_alpha, beta=priors.nu_beta)
    return sigma, nu


def build_model(d: PrimaryData, priors: Priors, frames: str = "non_centred", predictor: str = "cells"):
    """The registered model. Its data are ``pm.Data`` containers (the design, y, unit), so a
    compiled model refits another outcome or dataset of the same shape without recompiling
    (:func:`refit`). ``frames``: how the frame effects are sampled (``FRAME_PARAMETRISATIONS``);
    ``predictor``: how mu is evaluated (``PREDICTORS``); neither changes the model.
    The centring is read off this ``d``'s design; a refit of another design through
    ``with_data`` keeps the joint prior exactly (frame_effects = centred - means is
    MvNormal(0, chol) for any means), it may only mix less well."""
    import pymc as pm

    check_choice("frames", frames, FRAME_PARAMETRISATIONS)
    n_effects = d.Z.shape[1]
    coords = {"fixed": d.names, "frame_effect": FRAME_EFFECTS.get(n_effects, [f"e{i}" for i in range(n_effects)])}
    with pm.Model(coords=coords) as model:
        data = {k: pm.Data(k, v) for k, v in data_updates(d, predictor).items() if k != "document"}
        intercept = pm.Normal("intercept", 0.0, priors.intercept_sd)
        # A data container, so the prior-sensitivity refit (Normal(0, 1)) reuses the compiled model.
        fixed_sd = pm.Data("fixed_sd", np.asarray(priors.fixed_sd, dtype="float64"))
        beta = pm.Normal("beta", 0.0, fixed_sd, dims="fixed")
        means = (frame_means(frame_centring(d.X, d.Z, d.frame, d.n_frames), intercept, beta, d.n_frames)
                 if frames == "centred" else None)
        fixed = fixed_part(data, intercept, beta, covariate_columns(d.names, d.covariates))
        random = frame_and_unit_effects(data, d.n_frames, n_effects, d.n_units, priors, means)
        if d.document is not None:
            # H4 (6.1): an extra document intercept over the two content versions.
            doc_sd = pm.HalfNormal("document_sd", priors.group_sd)
            z_doc = pm.Normal("z_document", 0.0, 1.0, shape=d.n_documents)
            mu_doc = doc_sd * z_doc[pm.Data("document", d.document.astype("int64"))]
        else:
            mu_doc = 0.0
        sigma, nu = student_t_residual(priors)
        mu = fixed + random + mu_doc
        pm.StudentT("y_obs", nu=nu, mu=mu, sigma=sigma, observed=data["y"])
    return model


def _builder(frames: str, predictor: str):
    def build(d: PrimaryData, priors: Priors):
        return build_model(d, priors, frames=frames, predictor=predictor)

    build.__name__ = build.__qualname__ = f"build_model_{frames}_{predictor}"
    return build


#: One builder per (frames, predictor), so a compiled model is looked up by its form.
BUILDERS = {(f, p): _builder(f, p) for f in FRAME_PARAMETRISATIONS for p in PREDICTORS}


def same_shape(a: PrimaryData, b: PrimaryData) -> bool:
    """Whether ``b`` can go through a model compiled for ``a`` (same parameters)."""
    return (a.X.shape[1] == b.X.shape[1] and a.Z.shape[1] == b.Z.shape[1] and a.n_frames == b.n_frames
            and a.n_units == b.n_units and list(a.names) == list(b.names)
            and tuple(a.covariates) == tuple(b.covariates)
            and (a.document is None) == (b.document is None) and a.n_documents == b.n_documents)


def data_updates(d: PrimaryData, predictor: str = "cells") -> dict[str, np.ndarray]:
    """The model's data containers for ``d`` (what ``with_data`` swaps per fit)."""
    out = design_data(d.X, d.Z, d.frame, covariate_columns(d.names, d.covariates), predictor)
    out.update({"y": d.y, "unit": d.unit.astype("int64")})
    if d.document is not None:
        out["document"] = d.document.astype("int64")
    return out


#: Compiled models shared by every ``Fitter`` of this process: (builder, priors other than the
#: fixed-effect sd, reference data, compiled model). The main job runs all its steps in one
#: process, and three of them (pilot controls, the power pilot estimates, the posteriors) fit
#: the same model shape: each compilation cost about 19 s (numba), sampling a few.
COMPILED: list[tuple[object, Priors, object, object]] = []


class Fitter:
    """Compiles the registered model once per shape and process and refits other data of that
    shape through nutpie's ``with_data`` (compiling costs more than sampling at pilot sizes).
    ``cache``: the compiled models to look in and add to; the process-wide ``COMPILED`` unless
    given (a test passes its own list to compile afresh). ``frames``: how the primary model's
    frame effects are sampled (``FRAME_PARAMETRISATIONS``), ``predictor``: how its mu is
    evaluated (``PREDICTORS``); the posterior is the same."""

    def __init__(self, priors: Priors, draws: int, tune: int, chains: int, cache: list | None = None,
                 frames: str = "non_centred", predictor: str = "cells", rule=None):
        check_choice("frames", frames, FRAME_PARAMETRISATIONS, "Fitter")
        check_choice("predictor", predictor, PREDICTORS, "Fitter")
        self.priors, self.draws, self.tune, self.chains, self.frames = priors, draws, tune, chains, frames
        self.predictor = predictor
        # The registered frame-parametrisation rule (settings fitting.frame_parametrisation):
        # where given, each primary-model fit's form is chosen from its own data and ``frames``
        # is only the form of a lookup without data.
        self.rule = rule
        self._compiled = COMPILED if cache is None else cache
        self.compilations = 0  # by this Fitter (a model another Fitter compiled is reused, not counted)

    def _key(self) -> Priors:
        # fixed_sd is a data container of the model (swapped per fit), so it is not part of the key.
        return replace(self.priors, fixed_sd=0.0)

    def lookup(self, d, build=None, same=None):
        """The compiled model for ``d``'s shape under these priors, or None."""
        build, same = build or BUILDERS[(self.frames, self.predictor)], same or same_shape
        key = self._key()
        return next((c for b, p, ref, c in self._compiled
                     if b is build and p == key and type(ref) is type(d) and same(ref, d)), None)

    def compiled_for(self, d, build=None, same=None):
        """``lookup``, compiling (and keeping) the model for ``d``'s shape where there is none."""
        import nutpie

        build, same = build or BUILDERS[(self.frames, self.predictor)], same or same_shape
        compiled = self.lookup(d, build, same)
        if compiled is None:
            compiled = nutpie.compile_pymc_model(build(d, self.priors))
            self._compiled.append((build, self._key(), d, compiled))
            self.compilations += 1
        return compiled

    def form_for(self, d: PrimaryData) -> str:
        """How ``d``'s frame effects are sampled: the registered rule on ``d`` where this
        Fitter has one (``analysis.parametrisation``), else the fixed ``frames``."""
        if self.rule is None:
            return self.frames

        return frame_parametrisation(d, self.rule)

    def with_draws(self, draws: int) -> "Fitter":
        """The same Fitter (priors, rule, compiled models) sampling ``draws`` draws per chain:
        the convergence remedy's longer rerun (``fits.remedied``)."""
        other = copy.copy(self)
        other.draws = int(draws)
        return other

    def fit(self, d: PrimaryData, seed: int, fixed_sd: float | None = None):
        """Sample the registered model on ``d``; ``fixed_sd`` replaces the fixed-effect prior
        sd (the prior-sensitivity refit). ``d`` may also be a joint two-block model's data
        (``analysis.joint.JointData``), which names its own build/shape/update functions.
        A primary-model fit records its frame-effect form in ``idata.posterior.attrs``
        (``frame_parametrisation``)."""
        sd = self.priors.fixed_sd if fixed_sd is None else float(fixed_sd)
        form = None
        if hasattr(d, "model_functions"):
            build, same, updates = d.model_functions()
        else:
            form = self.form_for(d)
            build, same, updates = (BUILDERS[(form, self.predictor)], same_shape,
                                    lambda d: data_updates(d, self.predictor))
        try:
            import nutpie
        except ImportError:
            priors = Priors(**{**self.priors.__dict__, "fixed_sd": sd})
            return _with_form(sample(build(d, priors), self.draws, self.tune, self.chains, seed), form)
        compiled = self.compiled_for(d, build, same).with_data(**updates(d), fixed_sd=np.asarray(sd, dtype="float64"))
        with one_blas_thread():
            return _with_form(nutpie.sample(compiled, draws=self.draws, tune=self.tune, chains=self.chains, seed=seed,
                                            progress_bar=False, low_rank_modified_mass_matrix=True,
                                            **self.sample_options()), form)

    def sample_options(self) -> dict:
        """Extra ``nutpie.sample`` arguments (none here; a warm-started Fitter adds its start)."""
        return {}


def _with_form(idata, form: str | None):
    if form is not None:
        idata.posterior.attrs["frame_parametrisation"] = form
    return idata


def frame_form_of(idata) -> str | None:
    """The frame-effect form a ``Fitter`` fit was sampled with (None: not recorded, e.g. a
    joint model's fit)."""
    return idata.posterior.attrs.get("frame_parametrisation")


def one_blas_thread():
    """nutpie runs its chains in parallel threads; BLAS threads inside each chain then
    oversubscribe the cores (measured: about 7x slower per gradient at registered size on 2
    cores, benchmarks/RESULTS.md), so sampling runs with one BLAS thread per chain."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def sample(model, draws: int, tune: int, chains: int, seed: int, low_rank: bool = True):
    """nutpie (low-rank modified mass matrix, which FACTS measured ~10x better tail ESS/s);
    PyMC's own NUTS if nutpie cannot compile the model."""
    try:
        import nutpie

        compiled = nutpie.compile_pymc_model(model)
        with one_blas_thread():
            return nutpie.sample(compiled, draws=draws, tune=tune, chains=chains, seed=seed, progress_bar=False,
                                 low_rank_modified_mass_matrix=low_rank)
    except ImportError:
        import pymc as pm

        with model:
            return pm.sample(draws=draws, tune=tune, chains=chains, random_seed=seed, progressbar=False)


def cell_means(d: PrimaryData, beta: np.ndarray, intercept: np.ndarray, band: Sequence) -> dict[tuple[str, str], np.ndarray]:
    """mu(a, c): posterior draws of each cell mean averaged with equal weight over the band
    depths (and over order, option, rotation and fear at their design balance). Every band
    depth must be in the data (MissingBandDepthError otherwise)."""
    check_band(band, d.levels["depth"], "cell means")
    out = {}
    for agent in d.levels["agent"]:
        for content in d.levels["content"]:
            rows = np.stack([cell_row(agent, content, depth, d.levels, len(d.covariates)) for depth in band])
            out[(agent, content)] = intercept[:, None].squeeze(-1) + beta @ rows.mean(axis=0)
    return out


def hypotheses(mu: Mapping[tuple[str, str], np.ndarray], threat: str = "threat", harmless: str = "harmless") -> dict[str, np.ndarray]:
    """D3: H1 (threat priority), H2 (self-threat weight), H3 (self vs person) from cell means."""
    effect = {a: mu[(a, threat)] - mu[(a, harmless)] for a in {a for a, _ in mu}}
    return {
        "H1": np.mean([effect[a] for a in ("self", "peer", "person")], axis=0),
        "H2": effect["self"] - effect["peer"],
        "H3": effect["self"] - effect["person"],
    }


def convergence(idata, names: Sequence[str] = ("intercept", "beta", "sigma", "nu")) -> dict:
    """R-hat, bulk and tail ESS (worst over the named parameters) and divergences."""
    import arviz as az

    summary = az.summary(idata, var_names=list(names), kind="diagnostics")
    return {"max_rhat": float(summary["r_hat"].max()), "min_ess_bulk": float(summary["ess_bulk"].min()),
            "min_ess_tail": float(summary["ess_tail"].min()), "divergences": divergences(idata)}


def divergences(idata) -> int:
    """Divergent transitions of a posterior (0 where the sampler records none)."""
    return int(idata.sample_stats["diverging"].values.sum()) if "diverging" in idata.sample_stats else 0


class ResidualSDNotFiniteError(ValueError):
    """The fit puts nu <= 2 on half or more of its draws: a Student-t with nu <= 2 has no
    finite standard deviation, so gate (c)'s scale cannot be read from it."""


def student_t_sd(sigma, nu):
    """The SD of a Student-t with scale ``sigma`` and ``nu`` degrees of freedom,
    sigma * sqrt(nu / (nu - 2)); infinite where nu <= 2 (elementwise)."""
    sigma, nu = np.asarray(sigma, dtype=float), np.asarray(nu, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nu > 2, sigma * np.sqrt(nu / np.where(nu > 2, nu - 2, 1.0)), np.inf)


def implied_residual_sd(idata) -> float:
    """The trial-level residual SD implied by a Student-t fit (6.2: gate (c)'s sigma).

    Per draw, SD = sigma * sqrt(nu / (nu - 2)), the standard deviation of a Student-t with
    scale sigma and nu > 2 degrees of freedom (not the scale sigma itself, which understates
    it by that factor). A draw with nu <= 2 has an infinite SD. The point value is the
    posterior median over draws (infinite draws included as +inf): the mean is not used,
    because draws with nu just above 2 make it unstable. Reading taken: 6.2 asks for one
    number; the median is defined whenever fewer than half the draws have nu <= 2, and if half
    or more do, no finite SD exists and ResidualSDNotFiniteError says so."""
    sigma = posterior_draws(idata, "sigma")
    nu = posterior_draws(idata, "nu")
    if sigma.ndim != 1:
        raise ValueError("implied_residual_sd reads one residual scale; pass a primary-model fit, not a joint "
                         "model with reader-specific scales")
    value = float(np.median(student_t_sd(sigma, nu)))
    if not np.isfinite(value):
        raise ResidualSDNotFiniteError(
            f"{int((nu <= 2).sum())} of {len(nu)} posterior draws have nu <= 2, where the Student-t residual has no "
            f"finite SD: gate (c)'s scale cannot be set from this pilot fit; score more pilot trials")
    return value


def posterior_draws(idata, name: str) -> np.ndarray:
    values = idata.posterior[name].values
    return values.reshape(-1, *values.shape[2:])


def registered_fitter(view: Registered) -> Fitter:
    """The registered model under the registered priors and sampler (6.1), its frame effects
    sampled as the registered rule picks per fit (D3b; ``models.parametrisation``)."""
    s = view.sampler
    return Fitter(Priors.from_settings(view.settings), s.draws, s.tune, s.chains, rule=view.frame_parametrisation)
