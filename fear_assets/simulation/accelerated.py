"""The power simulation's accelerator path for every block (6.3, issue 28): many datasets of one
design fitted in one compiled JAX program, from PyMC's own graph of each block's registered
model.

``block_program`` builds the block's registered model (``blocks.BlockData.build``: the primary
model in the form the registered rule picks, the joint two-block model, or H5's probit) on one
dataset of the design and turns it into a JAX log density of (parameters, outcome)
(``vectorised.jaxified_logdensity``); every other dataset of the design differs only in its
outcome. The kept quantities per draw are the fixed effects the reported contrasts are linear
in (``intercept``, ``beta``, ``block_beta``; H5's ``dprime``) plus any named model variable on
its own scale (SBC's sigma, nu and frame SDs, through PyMC's graph as well). ``contrast_draws``
reads the reported contrasts from kept draws with the analysis code's own functions (the
block's ``contrasts``, given a posterior holding the kept variables with the model's dims).

``fit_batch`` samples K datasets x chains with the registered simulation sampler
(``settings.simulation_sampler``): jittered HMC in which every dataset adapts its own step size
and block metric with one pooled trajectory length (the registered algorithm); or, selectable,
jittered fixed-length HMC tuned once on a pilot batch (ChEES) and frozen, or NUTS from a
reference adaptation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fear_assets.models.parametrisation import CENTRED, NON_CENTRED, frame_parametrisation
from fear_assets.simulation.blocks import BlockData, outcome
from fear_assets.simulation.validation import convergence_counts
from fear_assets.simulation.vectorised import (BatchedAdaptiveHMC, BatchedChEES, BatchedNUTS, FrozenHMC, JaxifiedModel,
                                               Remedied, constrained_fn, extend_missing,
                                               jaxified_logdensity)

#: Jittered HMC with every dataset's own warm-up (``vectorised.BatchedAdaptiveHMC``), diagonal
#: mass matrix: a candidate of the CPU validation, not a registered ``simulation_sampler.algorithm``.
ADAPTIVE = "adaptive_hmc"
#: The same with a block mass matrix: dense on the global parameters, diagonal on the unit
#: intercepts (``dense_block_indices``), each adapted per dataset. A candidate, not registered.
ADAPTIVE_DENSE = "adaptive_hmc_dense"
#: The same with the dense block shrunk towards its diagonal (``vectorised.oas_towards_diagonal``):
#: a block of hundreds of coordinates estimated from a warm-up window. A candidate, not registered.
ADAPTIVE_DENSE_OAS = "adaptive_hmc_dense_oas"
#: The block metric with one trajectory length for the program (``pool_length``): the ChEES
#: criterion averaged over every dataset, each dataset keeping its own step size and metric (at
#: the registered size each dataset's own length, from 4 chains, stalled near its start on half
#: the datasets). The registered ``simulation_sampler.algorithm``: it passed item 3(a) at the
#: registered size in every scenario.
ADAPTIVE_DENSE_POOLED = "adaptive_hmc_dense_pooled"
DENSE_ALGORITHMS = (ADAPTIVE_DENSE, ADAPTIVE_DENSE_OAS, ADAPTIVE_DENSE_POOLED)
ADAPTIVE_ALGORITHMS = (ADAPTIVE, ADAPTIVE_DENSE, ADAPTIVE_DENSE_OAS, ADAPTIVE_DENSE_POOLED)
#: The value variables on the block metric's diagonal: one standardised intercept per unit
#: (or document), many, independent a priori given their scale; every other variable is global.
UNIT_INTERCEPTS = ("z_unit", "z_document")

#: Per model kind, the variables the reported contrasts are read from (all untransformed).
CONTRAST_VARIABLES = {"primary": ("intercept", "beta"), "joint": ("intercept", "beta", "block_beta"),
                      "h5": ("dprime",)}


@dataclass
class BlockProgram:
    """One block's design on the accelerator path: its registered model (built on one dataset),
    the JAX log density, and what each draw keeps (``kept``: names; ``shapes``: their shapes)."""

    block: BlockData
    model: object
    jm: JaxifiedModel
    kept: tuple[str, ...]
    shapes: list = field(default_factory=list)

    @property
    def kept_sizes(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    def keep_fn(self):
        """x -> the kept variables, flattened and concatenated (PyMC's graph, constrained scale)."""
        return constrained_fn(self.model, self.jm, self.kept)


def block_program(b: BlockData, priors, h5_priors, rule=None, extra: Sequence[str] = (),
                  form: str | None = None) -> BlockProgram:
    """The accelerator program of block ``b``'s design; ``extra``: further model variables kept
    per draw (e.g. ``sigma``, ``nu``, ``frame_chol_stds``); ``form``: a primary-model block's
    frame form where not the one ``rule`` picks."""
    model = b.build(priors, h5_priors, rule, form=form)
    jm = jaxified_logdensity(model)
    kept = tuple(CONTRAST_VARIABLES[b.kind]) + tuple(extra)
    point = model.initial_point()
    shapes = []
    for name in kept:
        var = model[name]
        value = model.rvs_to_values.get(var)
        shapes.append(tuple(np.asarray(point[value.name]).shape) if value is not None and value.name == name
                      else tuple(int(s) for s in var.shape.eval()))
    return BlockProgram(b, model, jm, kept, shapes)


class _Posterior:
    """The part of an InferenceData the analysis functions read: ``posterior[name].values``
    (chain, draw, ...) and, for H5, ``sel`` by the model's coordinates."""

    def __init__(self, dataset):
        self.posterior = dataset


def posterior_of(prog: BlockProgram, kept: np.ndarray):
    """A posterior (``idata.posterior`` as an xarray Dataset with the model's dims and coords)
    of one dataset's kept draws, (chains, draws, sum(kept sizes))."""
    import xarray as xr

    data, i = {}, 0
    dims_of = prog.model.named_vars_to_dims
    for name, shape, size in zip(prog.kept, prog.shapes, prog.kept_sizes):
        dims = tuple(dims_of.get(name, ())) or tuple(f"{name}_dim_{j}" for j in range(len(shape)))
        data[name] = (("chain", "draw", *dims), kept[:, :, i:i + size].reshape(kept.shape[:2] + tuple(shape)))
        i += size
    coords = {k: list(v) for k, v in prog.model.coords.items() if v is not None}
    used = {d for _, (dims, _) in data.items() for d in dims}
    return _Posterior(xr.Dataset(data, coords={k: v for k, v in coords.items() if k in used}))


def contrast_draws(prog: BlockProgram, kept: np.ndarray) -> dict[str, np.ndarray]:
    """The block's reported contrasts, (K, chains, draws) each, from kept draws (K, chains,
    draws, k) by the analysis code's own functions."""
    K, chains, draws = kept.shape[:3]
    per = [prog.block.contrasts(posterior_of(prog, kept[k])) for k in range(K)]
    return {c: np.stack([np.asarray(p[c]).reshape(chains, draws) for p in per]) for c in per[0]}


def kept_by_name(prog: BlockProgram, kept: np.ndarray) -> dict[str, np.ndarray]:
    """Kept draws split by variable: name -> (K, chains, draws, *shape)."""
    out, i = {}, 0
    for name, shape, size in zip(prog.kept, prog.shapes, prog.kept_sizes):
        out[name] = kept[..., i:i + size].reshape(kept.shape[:3] + tuple(shape))
        i += size
    return out


def kept_indices(prog: BlockProgram) -> np.ndarray:
    """The flat coordinates of ``prog``'s kept variables, in ``prog.kept``'s order: a sampler
    that keeps ``x[kept_indices]`` per draw keeps what ``prog.keep_fn()`` keeps, with no graph
    to run (a device without PyMC). Only a value variable on its own scale can be kept so (the
    reported contrasts' variables are: ``CONTRAST_VARIABLES``); a transformed one (``sigma``,
    sampled as its log) raises, naming it."""
    offsets = dict(zip(prog.jm.names, np.cumsum([0, *prog.jm.sizes])[:-1]))
    sizes = dict(zip(prog.jm.names, prog.jm.sizes))
    transformed = [n for n in prog.kept if n not in offsets]
    if transformed:
        raise ValueError(f"block {prog.block.block!r}: kept variable(s) {transformed} are sampled on a transformed "
                         f"scale (value variables: {list(prog.jm.names)}); keep them with prog.keep_fn(), not by index")
    return np.concatenate([np.arange(offsets[n], offsets[n] + sizes[n]) for n in prog.kept]).astype(np.int64)


def affine_contrasts(prog: BlockProgram, atol: float = 1e-9, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The block's reported contrasts as an affine map of its kept vector, ``H = kept @ W + c``,
    read from the analysis code's own contrast functions (``contrast_draws``) at the origin and
    the unit vectors, so a device can compute them from kept draws without PyMC or the analysis
    code. Every registered contrast is a difference of cell means, linear in the fixed effects;
    the map is checked against ``contrast_draws`` on random kept vectors and a contrast that is
    not affine raises (it would need its draws carried back instead)."""
    n = int(sum(prog.kept_sizes))
    basis = np.vstack([np.zeros(n), np.eye(n)])
    probe = contrast_draws(prog, basis[None, None])
    names = list(probe)
    H = np.stack([probe[c][0, 0] for c in names], axis=1)
    c, W = H[0], H[1:] - H[0]
    test = np.random.default_rng(seed).normal(size=(7, n))
    got = contrast_draws(prog, test[None, None])
    err = max(float(np.max(np.abs(test @ W[:, j] + c[j] - got[name][0, 0]))) for j, name in enumerate(names))
    if not err <= atol:
        raise ValueError(f"block {prog.block.block!r}: its contrasts {names} are not affine in the kept variables "
                         f"{list(prog.kept)} (largest error {err:.3g} > {atol:g}); carry their draws, not a map")
    return W, c, names


@dataclass
class Tuned:
    """A sampler tuned once for a design (``algorithm`` as in the settings) and its timings."""

    algorithm: str
    sampler: object
    params: object
    timings: dict


def tune(prog: BlockProgram, Y_pilot: np.ndarray, sampler_settings, seed: int, keep=None) -> Tuned:
    """The simulation sampler ``sampler_settings`` (``settings.simulation_sampler``'s fields)
    made ready for a design: the adaptive algorithms need no pilot (each dataset adapts in its
    own warm-up, from a cold start; ``target_accept`` and ``min_pooled_chains`` as given); ChEES
    is tuned on every pilot dataset (``Y_pilot``: rows of outcomes) and frozen; NUTS takes a
    reference adaptation on the first (diagonal mass matrix, as the nutpie loop's cold start
    has)."""
    s = sampler_settings
    keep = prog.keep_fn() if keep is None else keep
    timings: dict = {}
    if s.algorithm in ADAPTIVE_ALGORITHMS:
        # no pilot: every dataset adapts from a cold start (seeded jitter about PyMC's initial point)
        dense = dense_block_indices(prog.jm.names, prog.jm.sizes) if s.algorithm in DENSE_ALGORITHMS else None
        pooled = s.algorithm == ADAPTIVE_DENSE_POOLED
        sampler = BatchedAdaptiveHMC(prog.jm.logdensity, prog.jm.dim, prog.jm.x0, keep=keep,
                                     target_accept=s.target_accept, dense_idx=dense,
                                     shrink_dense=s.algorithm == ADAPTIVE_DENSE_OAS, pool_length=pooled,
                                     min_pooled_chains=s.min_pooled_chains if pooled else 0)
        params = FrozenHMC.cold_start(prog.jm.x0, s.chains, seed)
    elif s.algorithm == "chees_hmc":
        sampler = BatchedChEES(prog.jm.logdensity, prog.jm.dim, prog.jm.x0, keep=keep)
        params = sampler.tune(Y_pilot[:s.pilot_datasets], seed, s.pilot_steps, s.chains, timings=timings)
    else:
        sampler = _NUTSKeep(prog.jm.logdensity, prog.jm.dim, prog.jm.x0, keep)
        params = sampler.reference(Y_pilot[0], seed, s.pilot_steps, s.chains, dense=False, timings=timings)
    return Tuned(s.algorithm, sampler, params, timings)


class _NUTSKeep(BatchedNUTS):
    """``BatchedNUTS`` keeping ``keep(x)`` per draw (constrained quantities) rather than indices."""

    def __init__(self, logdensity, dim, x0, keep):
        super().__init__(logdensity, dim, x0, np.arange(dim))
        self._keep = keep

    def _compile(self, warmup, draws, target_accept):
        import jax

        keep, inner = self._keep, super()._compile(warmup, draws, target_accept)

        def run(*args):
            kept, div, grads, step = inner(*args)
            return jax.vmap(jax.vmap(jax.vmap(keep)))(kept), div, grads, step

        return jax.jit(run)


def dense_block_indices(names: Sequence[str], sizes: Sequence[int], diagonal: Sequence[str] = UNIT_INTERCEPTS) -> np.ndarray:
    """The flat coordinates of the block metric's dense part: every value variable (``names``, in
    the flat layout's order, with ``sizes``) but the unit intercepts (``diagonal``)."""
    offsets = np.cumsum([0, *sizes])
    idx = [np.arange(offsets[i], offsets[i + 1]) for i, n in enumerate(names) if n not in diagonal]
    if not idx:
        raise ValueError(f"no global parameter among {list(names)}: nothing to make dense")
    return np.concatenate(idx).astype(np.int64)


def fit_batch(tuned: Tuned, Y: np.ndarray, seed: int, warmup: int, draws: int) -> dict:
    """K datasets (rows of ``Y``) x the tuned chains in one program: ``kept`` (K, chains, draws,
    k), ``divergences`` and ``gradients`` (K, chains), ``timings`` (compile_s, run_s)."""
    timings: dict = {}
    out = tuned.sampler.fit_kept(Y, tuned.params, seed, warmup, draws, timings=timings)
    return {**out, "timings": timings}


def fit_with_remedy(prog: BlockProgram, tuned: Tuned, Y: np.ndarray, sampler, seed: int, convergence,
                    extensions: int) -> tuple[dict, Remedied]:
    """One program's datasets (the rows of ``Y``) fitted (seed ``seed + 1``), then the
    registered remedy (``vectorised.extend_missing``: only the datasets missing the
    ``convergence`` rule on a reported contrast continue, ``sampler.extension_draws`` more, seed
    ``seed + 2 + r``, up to ``extensions`` rounds, and are then kept: D7). Returns the first fit
    (its ``timings`` with the extensions' ``extension_compile_s``/``_run_s``) and each dataset's
    draws and divergences."""
    fit = fit_batch(tuned, Y, seed + 1, sampler.warmup, sampler.draws)
    remedied = extend_missing(tuned.sampler, Y, fit, lambda kept: contrast_draws(prog, kept),
                              lambda draws, div: convergence_counts(draws, convergence, div)["failing"],
                              seed + 2, sampler.extension_draws, extensions)
    timings = {**fit["timings"], "extension_compile_s": remedied.compile_s, "extension_run_s": remedied.run_s}
    return {**fit, "timings": timings}, remedied


def frame_form(b: BlockData, rule) -> str | None:
    """The frame form the registered rule picks for a primary-model block's data (None for
    the joint and H5 models, whose form is fixed): datasets of one design but different forms
    are fitted by different programs, as the nutpie loop fits each in its own form."""
    return frame_parametrisation(b.data, rule) if b.kind == "primary" and rule is not None else None


def other_form(form: str) -> str:
    """The frame form the rule did not pick: the same model's posterior in other coordinates."""
    return NON_CENTRED if form == CENTRED else CENTRED


def refits_in_other_form(forms: Sequence[str | None], divergences: Sequence[np.ndarray]) -> dict[str, list[int]]:
    """The datasets the other frame form refits (``fit_block``), by the form they were fitted
    in: every primary-model dataset (one with a form) whose draws, its extensions' included,
    still hold a divergent transition. More draws do not cure a divergence, which is the
    geometry's (a funnel in the centred form, or the non-centred form's where the data pin a
    frame down); the other coordinates can. Pure."""
    out: dict[str, list[int]] = {}
    for k, (form, d) in enumerate(zip(forms, divergences)):
        if form is not None and int(np.sum(d)) > 0:
            out.setdefault(form, []).append(k)
    return dict(sorted(out.items()))


@dataclass
class BlockFit:
    """One block of many datasets fitted on the accelerator path (``fit_block``): per reported
    contrast, each dataset's draws (chains, draws; an extended fit has more); each dataset's
    divergences per chain and the frame form its kept draws were sampled in; and one record per
    compiled program (form, datasets, timings, extensions, step size, trajectory length; a
    refit's ``refit_of``: the form it replaced)."""

    contrasts: dict[str, list[np.ndarray]]
    divergences: list[np.ndarray]
    forms: list[str | None]
    programs: list[dict]
    tune_s: float = 0.0
    run_s: float = 0.0


def fit_block(datasets: Sequence[BlockData], pilot: Sequence[BlockData], priors, h5_priors, rule, sampler, seed: int,
              convergence, max_extensions: int, log=lambda message: None) -> BlockFit:
    """The datasets of one block (one design) fitted with the simulation sampler ``sampler``
    (``settings.simulation_sampler``'s fields, or a candidate's with the same names): one program
    per frame form the registered ``rule`` picks (the nutpie loop fits each dataset in its form),
    tuned on the ``pilot`` datasets of that form (ChEES, NUTS; none: the scored ones) or adapted
    per dataset (the adaptive algorithms).

    The adaptive candidates' remedy, in order: a dataset missing the ``convergence`` rule on a
    reported contrast is extended by the sampler's ``extension_draws``, up to ``max_extensions``
    times (``fit_with_remedy``); a primary-model dataset still divergent after that is fitted
    again, warm-up and extensions included, in the OTHER frame form (``refits_in_other_form``; D3b:
    any reparametrisation that leaves the joint prior as stated may make the sampler mix, and
    the long nutpie references are retried so too), and that fit is kept whatever it reaches
    (D7: counted, never dropped). The frozen samplers have neither: such a fit is kept and
    flagged. Seeds: ``seed`` tunes, ``seed + 1`` fits, ``seed + 2 + r`` extends; the other
    form's fit the same from ``seed + 3 + max_extensions``."""
    K = len(datasets)
    Y = np.stack([outcome(b) for b in datasets])
    Y_pilot = np.stack([outcome(b) for b in pilot]) if pilot else Y[:0]
    forms = [frame_form(b, rule) for b in datasets]
    pilot_forms = [frame_form(b, rule) for b in pilot]
    adaptive = sampler.algorithm in ADAPTIVE_ALGORITHMS
    extensions = max_extensions if adaptive else 0
    contrasts: dict[str, dict[int, np.ndarray]] = {}
    divergent: dict[int, np.ndarray] = {}
    programs: list[dict] = []
    seconds = {"tune": 0.0, "run": 0.0}

    def fit_program(idx: list[int], form: str | None, program_seed: int, own_pilot: list[int]) -> dict:
        prog = block_program(datasets[idx[0]], priors, h5_priors, rule=rule, form=form)
        tuning = Y_pilot[own_pilot] if own_pilot else Y[idx]
        t = time.perf_counter()
        tuned = tune(prog, tuning, sampler, program_seed)
        seconds["tune"] += time.perf_counter() - t
        fit, remedied = fit_with_remedy(prog, tuned, Y[idx], sampler, program_seed, convergence, extensions)
        draws, div, extended = remedied.draws, remedied.divergences, remedied.extended
        seconds["run"] += fit["timings"]["run_s"] + fit["timings"].get("extension_run_s", 0.0)
        for c, x in draws.items():  # a refit's draws replace the first form's
            for j, k in enumerate(idx):
                contrasts.setdefault(c, {})[k] = x[j]
        for j, k in enumerate(idx):
            divergent[k] = div[j]
            forms[k] = form
        ad = fit.get("adapted")
        log(f"{datasets[idx[0]].block} (form {form}): {len(idx)} datasets, {len(extended)} extension(s), "
            f"run {fit['timings']['run_s']:.1f} s")
        return {
            "form": form, "datasets": idx, "pilot": own_pilot if not adaptive else [],
            "timings": fit["timings"], "tune": tuned.timings, "extensions": len(extended),
            "datasets_extended": extended,
            "draws_per_chain": int(fit["kept"].shape[2]),
            # where a pooled length's floor added helper chains to the warm-up
            "warmup_chains": (tuned.sampler.warmup_chains(len(idx), sampler.chains) if adaptive else sampler.chains),
            "draws_per_chain_per_dataset": [int(x.shape[1]) for x in draws[next(iter(draws))]],
            "divergences": [int(np.sum(d)) for d in div],
            "warmup_divergences": (np.asarray(fit["warmup_divergences"]).sum(axis=1).tolist()
                                   if "warmup_divergences" in fit else None),
            "leapfrog_steps": int(np.asarray(fit["gradients"]).max()),
            "step_size": (ad.step_size.tolist() if ad is not None else getattr(tuned.params, "step_size", None)),
            "trajectory_length": (ad.trajectory_length.tolist() if ad is not None
                                  else getattr(tuned.params, "trajectory_length", None)),
            "parameters": int(prog.jm.dim),
            "dense_block": 0 if ad is None or ad.dense_idx is None else len(ad.dense_idx)}

    for form in sorted(set(forms), key=str):
        idx = [k for k in range(K) if forms[k] == form]
        programs.append(fit_program(idx, form, seed, [j for j in range(len(pilot)) if pilot_forms[j] == form]))
    if adaptive:
        # grouped before any refit: a refit changes its datasets' forms
        for form, idx in refits_in_other_form(forms, [divergent[k] for k in range(K)]).items():
            programs.append({**fit_program(idx, other_form(form), seed + 3 + max_extensions, []), "refit_of": form})
    return BlockFit({c: [v[k] for k in range(K)] for c, v in contrasts.items()}, [divergent[k] for k in range(K)],
                    forms, programs, seconds["tune"], seconds["run"])
