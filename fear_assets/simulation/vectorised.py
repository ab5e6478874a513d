"""Many simulated datasets' chains in one JAX program: a fitting-path candidate (6.3, issue 11).

Every simulated dataset of a family and frame count shares the design; only the outcome
vector differs. So the registered PyMC model (``primary_model.build_model``, compiled from the
analysis code, never rewritten) is turned into one JAX log density of (unconstrained
parameters, outcome vector) with PyMC's own ``get_jaxified_graph``, and BlackJAX's NUTS runs
every (dataset, chain) pair at once under ``jax.vmap`` inside one ``lax.scan``:

1. a reference fit on one dataset of the design (BlackJAX window adaptation) gives the
   diagonal inverse mass matrix, the step size and a starting point: the posterior geometry
   barely changes between datasets of one design;
2. per dataset, a short warm-up from the reference's final positions (the step size re-tuned
   by dual averaging, the mass matrix kept), then the draws.

Model and priors are untouched; only the sampler's adaptation differs from the registered
path, so the candidate is used only where ``benchmarks/power.py`` shows its 99% HDIs within
0.02 of a long run on the same datasets. Every fit keeps its draws per chain (R-hat, ESS) and
its divergences.

The sampler (``BatchedNUTS``) needs only a JAX log density of (x, y) and its dimension, start
point and kept indices: it imports no PyMC, so it also runs from a log density that was
exported here (``export_logdensity``, ``jax.export`` with a symbolic batch dimension) and
loaded on a machine without PyMC (``exported_logdensity``; ``benchmarks/power_gpu.py``).
Only ``VectorisedNUTS`` / ``jaxified_logdensity`` build the log density from the registered
model, and they import PyMC inside.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np


@dataclass
class Reference:
    step_size: float
    inverse_mass_matrix: np.ndarray
    positions: np.ndarray  # (chains, dim): where each dataset's chains start


@dataclass
class JaxifiedModel:
    """The registered model's log density of (flat unconstrained parameters, outcome vector)
    and the layout of the flat vector. ``observed``: the observed variables whose data are the
    outcome input, in order, with their lengths (``rows``) and dtypes; with several, the
    outcome vector is their data concatenated."""
    logdensity: Callable
    names: list
    shapes: list
    sizes: list
    x0: np.ndarray
    observed: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    y0: np.ndarray | None = None  # the outcome the model was built with

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    def slices(self) -> dict:
        offsets = np.cumsum([0] + self.sizes)
        return {n: slice(int(offsets[i]), int(offsets[i + 1])) for i, n in enumerate(self.names)}

    def point(self, x: np.ndarray) -> dict:
        """A flat vector as PyMC's point dict (value variables by name)."""
        return {n: np.asarray(x[s]).reshape(sh) for (n, s), sh in zip(self.slices().items(), self.shapes)}


def _register_erfcx() -> None:
    """A JAX implementation of PyTensor's ``erfcx`` (H5's probit log-likelihood uses it; PyTensor
    ships one only through TensorFlow Probability, which no host here has): exp(x^2) erfc(x)
    up to x = 25 (erfc still a normal float there), the asymptotic series beyond (its first
    omitted term < 1e-14 relative), and PyTensor's own derivative 2 x erfcx(x) - 2 / sqrt(pi),
    so the gradient is the one PyTensor differentiates symbolically."""
    import jax
    import jax.numpy as jnp
    from pytensor.link.jax.dispatch import jax_funcify
    from pytensor.scalar.math import Erfcx

    @jax.custom_jvp
    def erfcx(x):
        big = x > 25.0
        xs = jnp.where(big, 25.0, x)
        direct = jnp.exp(xs * xs) * jax.scipy.special.erfc(xs)
        xb = jnp.where(big, x, 26.0)
        u = 1.0 / (xb * xb)
        series = 1.0 + u * (-0.5 + u * (0.75 + u * (-1.875 + u * (6.5625 + u * -29.53125))))
        return jnp.where(big, series / (xb * np.sqrt(np.pi)), direct)

    @erfcx.defjvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = erfcx(x)
        return y, (2.0 * x * y - 2.0 / np.sqrt(np.pi)) * t

    jax_funcify.register(Erfcx)(lambda op, **kwargs: erfcx)


def jaxified_logdensity(model, observed: Sequence[str] | None = None) -> JaxifiedModel:
    """PyMC's own JAX graph of ``model.logp(jacobian=True)`` with the data of the observed
    variables (all of them, or those named in ``observed``) replaced by inputs: the same graph
    and priors, whatever the model (a data container or constant data, any dtype). Every
    registered analysis model goes through here; none is written twice. Imports PyMC and
    PyTensor."""
    import pytensor
    import pytensor.tensor as pt
    from pymc.sampling.jax import get_jaxified_graph

    _register_erfcx()
    rvs = list(model.observed_RVs) if observed is None else [model[n] for n in observed]
    if not rvs:
        raise ValueError("the model has no observed variable: nothing to make an input of")
    data = [model.rvs_to_values[rv] for rv in rvs]
    if any(d.ndim != 1 for d in data):
        raise ValueError(f"observed data of {[rv.name for rv in rvs]} must be vectors (one value per trial)")
    inputs = [pt.vector(f"{rv.name}_in", dtype=d.dtype) for rv, d in zip(rvs, data)]
    logp = pytensor.graph.replace.graph_replace(model.logp(jacobian=True), dict(zip(data, inputs)), strict=False)
    values = model.value_vars
    fn = get_jaxified_graph(inputs=[*values, *inputs], outputs=[logp])
    point = model.initial_point()
    names = [v.name for v in values]
    shapes = [np.asarray(point[n]).shape for n in names]
    sizes = [int(np.prod(s)) for s in shapes]
    y_parts = [np.asarray(d.get_value() if hasattr(d, "get_value") else d.data) for d in data]
    rows = [len(p) for p in y_parts]
    dtypes = [d.dtype for d in data]

    def logdensity(x, y):
        parts, i = [], 0
        for n, sh in zip(sizes, shapes):
            parts.append(x[i:i + n].reshape(sh))
            i += n
        ys, j = [], 0
        for n, dt in zip(rows, dtypes):
            # the outcome travels as floats (one batched array); an integer observation (a
            # choice) is cast back to the model's dtype, exactly as its 0/1 values
            ys.append(y[j:j + n].astype(dt))
            j += n
        return fn(*parts, *ys)[0]

    x0 = np.concatenate([np.asarray(point[n], dtype=float).reshape(-1) for n in names])
    y0 = np.concatenate([p.astype(float) for p in y_parts])
    return JaxifiedModel(logdensity, names, shapes, sizes, x0, [rv.name for rv in rvs], rows, y0)


def check_logdensity(model, jm: JaxifiedModel, points: np.ndarray, y: np.ndarray | None = None) -> dict:
    """Largest differences between ``jm``'s log density and gradient (in-process JAX, float64)
    and PyMC's own compiled ``model.compile_logp()`` / ``compile_dlogp()`` at ``points`` (n,
    dim), the JAX side given ``y`` (default: the outcome the model holds): absolute, and
    relative (|diff| / max(1, |logp|); the gradient normwise, / max(1, max |dlogp|))."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    logp, dlogp = model.compile_logp(jacobian=True), model.compile_dlogp(jacobian=True)
    yj = jnp.asarray(jm.y0 if y is None else y, dtype=jnp.float64)
    vg = jax.jit(jax.value_and_grad(lambda x: jm.logdensity(x, yj)))
    out = {"logp": 0.0, "dlogp": 0.0, "logp_rel": 0.0, "dlogp_rel": 0.0}
    for x in np.asarray(points, dtype=float):
        v, g = vg(jnp.asarray(x))
        point = jm.point(x)
        lp, dlp = float(logp(point)), np.asarray(dlogp(point))
        out["logp"] = max(out["logp"], abs(lp - float(v)))
        out["dlogp"] = max(out["dlogp"], float(np.max(np.abs(dlp - np.asarray(g)))))
        out["logp_rel"] = max(out["logp_rel"], abs(lp - float(v)) / max(1.0, abs(lp)))
        out["dlogp_rel"] = max(out["dlogp_rel"],
                               float(np.max(np.abs(dlp - np.asarray(g))) / max(1.0, np.max(np.abs(dlp)))))
    return out


def export_logdensity(logdensity: Callable, dim: int, rows: int, dtype=np.float64,
                      platforms: Sequence[str] = ("cpu", "cuda")) -> bytes:
    """Serialized ``jax.export`` of the batched value and gradient: (X (b, dim), Y (b, rows))
    -> (values (b,), gradients (b, dim)), b symbolic, lowered for every platform named (a
    CPU-only jaxlib cross-lowers for 'cuda'). An exported function has no vmap rule, hence the
    explicit batch; ``exported_logdensity`` restores per-chain calls."""
    import jax

    batched = jax.jit(jax.vmap(jax.value_and_grad(logdensity)))
    (b,) = jax.export.symbolic_shape("b")
    # no file names in the module's debug locations (PyTensor's JAX code lives in temporary
    # files with random names; local paths need not travel). Two exports of one model can still
    # differ in a location's line number, never in the program.
    regex = jax.config.jax_hlo_source_file_canonicalization_regex
    jax.config.update("jax_hlo_source_file_canonicalization_regex", ".*")
    try:
        exp = jax.export.export(batched, platforms=tuple(platforms))(jax.ShapeDtypeStruct((b, dim), dtype),
                                                                     jax.ShapeDtypeStruct((b, rows), dtype))
        return bytes(exp.serialize())
    finally:
        jax.config.update("jax_hlo_source_file_canonicalization_regex", regex)


def exported_logdensity(blob: bytes) -> Callable:
    """A log density of (x, y) that BlackJAX can differentiate and vmap, from
    ``export_logdensity``'s bytes: ``custom_vmap`` sends a vmapped call to the batched export
    (an unbatched argument broadcast), ``custom_vjp`` returns the exported gradient. One vmap
    level (``BatchedNUTS`` flattens datasets x chains into one axis)."""
    import jax
    import jax.numpy as jnp

    exp = jax.export.deserialize(bytearray(blob))

    @jax.custom_batching.custom_vmap
    def value_and_grad(x, y):
        v, g = exp.call(x[None], y[None])
        return v[0], g[0]

    @value_and_grad.def_vmap
    def _batched(axis_size, in_batched, x, y):
        x = x if in_batched[0] else jnp.broadcast_to(x, (axis_size,) + x.shape)
        y = y if in_batched[1] else jnp.broadcast_to(y, (axis_size,) + y.shape)
        return exp.call(x, y), (True, True)

    @jax.custom_vjp
    def logdensity(x, y):
        return value_and_grad(x, y)[0]

    def fwd(x, y):
        v, g = value_and_grad(x, y)
        return v, (g, jnp.zeros_like(y))

    def bwd(res, ct):
        g, zy = res
        return ct * g, zy  # the outcome is data: its cotangent is never used

    logdensity.defvjp(fwd, bwd)
    return logdensity


class BatchedNUTS:
    """BlackJAX NUTS over many datasets' chains in one JAX program, from any log density
    ``logdensity(x, y)`` (x: flat unconstrained parameters of size ``dim``, y: one dataset's
    outcome vector). ``keep_idx``: the entries of x whose draws are returned. No PyMC here."""

    def __init__(self, logdensity: Callable, dim: int, x0: np.ndarray, keep_idx: np.ndarray, float32: bool = False):
        import jax

        jax.config.update("jax_enable_x64", not float32)
        self.dtype = np.float32 if float32 else np.float64
        self.logdensity = logdensity
        self.dim = int(dim)
        self.x0 = np.asarray(x0, dtype=float)
        self.keep_idx = np.asarray(keep_idx, dtype=np.int64)
        self._run = None

    # -- reference adaptation on one dataset --------------------------------------------------
    def reference(self, y: np.ndarray, seed: int, steps: int, chains: int, dense: bool = True,
                  timings: dict | None = None) -> Reference:
        """BlackJAX window adaptation on one dataset, one run per chain (vmapped); the mass
        matrices and step sizes are averaged over chains (log scale for the step size).
        ``timings`` (if given) gets ``compile_s`` and ``run_s``."""
        import blackjax
        import jax
        import jax.numpy as jnp

        yj = jnp.asarray(y, dtype=self.dtype)
        lp = lambda x: self.logdensity(x, yj)  # noqa: E731
        keys = jax.random.split(jax.random.PRNGKey(seed), chains + 1)
        inits = jnp.asarray(self.x0, dtype=self.dtype) + 0.1 * jax.random.normal(keys[0], (chains, self.dim),
                                                                                    dtype=self.dtype)

        def adapt(key, x):
            warm = blackjax.window_adaptation(blackjax.nuts, lp, is_mass_matrix_diagonal=not dense)
            (state, params), _ = warm.run(key, x, num_steps=steps)
            return state.position, params["step_size"], params["inverse_mass_matrix"]

        t = time.perf_counter()
        compiled = jax.jit(jax.vmap(adapt)).lower(keys[1:], inits).compile()
        t1 = time.perf_counter()
        pos, step, imm = jax.block_until_ready(compiled(keys[1:], inits))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        return Reference(float(np.exp(np.mean(np.log(np.asarray(step))))), np.asarray(imm).mean(axis=0),
                         np.asarray(pos))

    # -- many datasets at once --------------------------------------------------------------
    def _compile(self, warmup: int, draws: int, target_accept: float):
        import blackjax
        import jax
        import jax.numpy as jnp
        from blackjax.adaptation.step_size import dual_averaging_adaptation

        keep_idx = jnp.asarray(self.keep_idx)
        logdensity = self.logdensity
        da_init, da_update, da_final = dual_averaging_adaptation(target_accept)

        def chain(key, x0, y, step0, imm):
            lp = lambda x: logdensity(x, y)  # noqa: E731
            state = blackjax.nuts(lp, step0, imm).init(x0)

            def warm_step(carry, k):
                st, da = carry
                kern = blackjax.nuts(lp, jnp.exp(da.log_step_size), imm)
                st, info = kern.step(k, st)
                return (st, da_update(da, info.acceptance_rate)), info.num_integration_steps

            kw, kd = jax.random.split(key)
            (state, da), n_warm = jax.lax.scan(warm_step, (state, da_init(step0)), jax.random.split(kw, warmup))
            step = da_final(da)
            kern = blackjax.nuts(lp, step, imm)

            def draw_step(st, k):
                st, info = kern.step(k, st)
                return st, (st.position[keep_idx], info.is_divergent, info.num_integration_steps)

            _, (kept, div, n_draw) = jax.lax.scan(draw_step, state, jax.random.split(kd, draws))
            return kept, div.sum(), n_warm.sum() + n_draw.sum(), step

        # datasets x chains flattened into ONE vmap axis (an exported log density batches one level)
        per_chain = jax.vmap(chain, in_axes=(0, 0, 0, None, None))

        def run(keys, positions, Y, step0, imm):
            K, chains = keys.shape[:2]
            flat = per_chain(keys.reshape((K * chains,) + keys.shape[2:]), jnp.tile(positions, (K, 1)),
                             jnp.repeat(Y, chains, axis=0), step0, imm)
            return jax.tree_util.tree_map(lambda a: a.reshape((K, chains) + a.shape[1:]), flat)

        return jax.jit(run)

    def fit_kept(self, Y: np.ndarray, ref: Reference, seed: int, warmup: int, draws: int,
                 target_accept: float = 0.8, timings: dict | None = None) -> dict:
        """``Y``: (K datasets, rows). Returns ``kept`` draws (K, chains, draws, len(keep_idx)),
        ``divergences`` and ``gradients`` (K, chains), the final ``step_size`` (K, chains).
        ``timings`` (if given) gets ``compile_s`` (lowering + XLA compile, first call per shape
        only) and ``run_s``."""
        import jax
        import jax.numpy as jnp

        K, chains = len(Y), len(ref.positions)
        keys = jax.random.split(jax.random.PRNGKey(seed), K * chains).reshape(K, chains, -1)
        args = (keys, jnp.asarray(ref.positions, dtype=self.dtype), jnp.asarray(Y, dtype=self.dtype),
                jnp.asarray(ref.step_size, dtype=self.dtype), jnp.asarray(ref.inverse_mass_matrix, dtype=self.dtype))
        key = (warmup, draws, target_accept, K, chains, np.shape(Y)[1])
        t = time.perf_counter()
        if self._run is None or self._run[0] != key:
            self._run = (key, self._compile(warmup, draws, target_accept).lower(*args).compile())
        t1 = time.perf_counter()
        kept, div, grads, step = jax.block_until_ready(self._run[1](*args))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        return {"kept": np.asarray(kept, dtype=float), "divergences": np.asarray(div),
                "gradients": np.asarray(grads), "step_size": np.asarray(step)}


class VectorisedNUTS(BatchedNUTS):
    """One JAX log density of the registered model for a design; ``fit_many`` samples K
    datasets' outcomes at once. ``keep`` names the model variables whose draws are returned
    (untransformed ones: ``intercept``, ``beta``)."""

    def __init__(self, model, keep: Sequence[str] = ("intercept", "beta"), float32: bool = False):
        import jax

        jax.config.update("jax_enable_x64", not float32)  # before PyMC's graph is jaxified
        jm = jaxified_logdensity(model)
        self.model = jm
        self.names, self.shapes, self.sizes = jm.names, jm.shapes, jm.sizes
        self.slices = jm.slices()
        missing = [k for k in keep if k not in self.slices]
        if missing:
            raise ValueError(f"variables {missing} are not untransformed value variables of the model "
                             f"({self.names}): keep only those")
        self.keep = tuple(keep)
        keep_idx = np.concatenate([np.arange(jm.dim)[self.slices[k]] for k in self.keep])
        super().__init__(jm.logdensity, jm.dim, jm.x0, keep_idx, float32)

    def fit_many(self, Y: np.ndarray, ref: Reference, seed: int, warmup: int, draws: int,
                 target_accept: float = 0.8) -> dict:
        """``Y``: (K datasets, rows). Returns kept draws per variable (K, chains, draws, shape),
        the divergences (K, chains), gradient evaluations (K, chains) and the final step sizes."""
        res = self.fit_kept(Y, ref, seed, warmup, draws, target_accept)
        kept = res.pop("kept")
        out, i = dict(res), 0
        for name in self.keep:
            n = self.sizes[self.names.index(name)]
            out[name] = kept[..., i:i + n].reshape(kept.shape[:3] + self.shapes[self.names.index(name)])
            i += n
        return out


def check_export(model, jm: JaxifiedModel, blob: bytes, y: np.ndarray, points: np.ndarray) -> dict:
    """Largest differences between the exported log density (and its gradient) and PyMC's own
    compiled ``model.compile_logp()`` / ``compile_dlogp()`` at ``points`` (n, dim), with the
    model's observed outcome equal to ``y``: absolute, and relative (|diff| / max(1, |logp|),
    for the gradient normwise: / max(1, max |dlogp|)). Gradient entries are sums of large
    terms over thousands of rows that partly cancel, so two correct summation orders (PyTensor's
    C code, XLA) differ by ~1e-9 absolute in one entry; the normwise scale is the fair one."""
    import jax.numpy as jnp

    logp, dlogp = model.compile_logp(jacobian=True), model.compile_dlogp(jacobian=True)
    exp = __import__("jax").export.deserialize(bytearray(blob))
    values, grads = exp.call(jnp.asarray(points), jnp.asarray(np.broadcast_to(y, (len(points), len(y)))))
    out = {"logp": 0.0, "dlogp": 0.0, "logp_rel": 0.0, "dlogp_rel": 0.0}
    for x, v, g in zip(points, np.asarray(values), np.asarray(grads)):
        point, i = {}, 0
        for n, sh, k in zip(jm.names, jm.shapes, jm.sizes):
            point[n] = np.asarray(x[i:i + k]).reshape(sh)
            i += k
        lp, dlp = float(logp(point)), np.asarray(dlogp(point))
        out["logp"] = max(out["logp"], abs(lp - float(v)))
        out["dlogp"] = max(out["dlogp"], float(np.max(np.abs(dlp - g))))
        out["logp_rel"] = max(out["logp_rel"], abs(lp - float(v)) / max(1.0, abs(lp)))
        out["dlogp_rel"] = max(out["dlogp_rel"], float(np.max(np.abs(dlp - g)) / max(1.0, np.max(np.abs(dlp)))))
    return out


@dataclass
class FrozenHMC:
    """Jittered fixed-length HMC's parameters, tuned once on a pilot batch of datasets of one
    design (ChEES) and then frozen for every dataset of that design: the step size, the
    trajectory length (each transition integrates ceil(u L / step) leapfrog steps, u ~ U(0, 1)
    shared by every chain of the batch, so no chain waits for another's trajectory), the
    diagonal inverse mass matrix, and the chains' start points."""

    step_size: float
    trajectory_length: float
    inverse_mass_matrix: np.ndarray
    positions: np.ndarray  # (chains, dim)

    @property
    def mean_steps(self) -> float:
        return 0.5 * self.trajectory_length / self.step_size

    @classmethod
    def cold_start(cls, x0: np.ndarray, chains: int, seed: int) -> "FrozenHMC":
        """Where a per-dataset warm-up (``BatchedAdaptiveHMC``) starts: ``chains`` points jittered
        uniformly within +-0.5 of the model's initial point ``x0`` (seeded), a small step, a
        unit trajectory and an identity metric; the warm-up adapts all of them."""
        jitter = np.random.default_rng(seed).uniform(-1.0, 1.0, (chains, len(x0)))
        return cls(0.05, 1.0, np.ones(len(x0)), np.asarray(x0, dtype=float) + 0.5 * jitter)


class BatchedChEES:
    """Jittered fixed-length HMC over many datasets' chains in one JAX program, from any log
    density ``logdensity(x, y)`` (as ``BatchedNUTS``; no PyMC here). ``tune`` runs BlackJAX's
    ChEES adaptation (step size by dual averaging, trajectory length by the ChEES criterion,
    a diagonal mass matrix from the chains' ensemble) on each pilot dataset at once and freezes
    the averages; ``fit_kept`` then samples K datasets x chains with those parameters: a
    warm-up that only moves the chains from the pilot's positions to each dataset's posterior
    (nothing adapts), then the draws. ``keep``: x -> the vector of each draw returned (default
    ``x[keep_idx]``; a PyMC-graph function gives constrained quantities, ``constrained_fn``)."""

    def __init__(self, logdensity: Callable, dim: int, x0: np.ndarray, keep_idx: np.ndarray | None = None,
                 keep: Callable | None = None, float32: bool = False, max_steps: int = 256):
        import jax

        jax.config.update("jax_enable_x64", not float32)
        self.dtype = np.float32 if float32 else np.float64
        self.logdensity, self.dim, self.x0 = logdensity, int(dim), np.asarray(x0, dtype=float)
        idx = None if keep_idx is None else np.asarray(keep_idx, dtype=np.int64)
        self.keep = keep if keep is not None else (lambda x: x[idx]) if idx is not None else (lambda x: x)
        self.max_steps = int(max_steps)
        self._run = None

    def tune(self, Y_pilot: np.ndarray, seed: int, steps: int, chains: int, timings: dict | None = None,
             learning_rate: float = 0.025, initial_step: float = 0.1) -> FrozenHMC:
        """ChEES on each pilot dataset (rows of ``Y_pilot``) with ``chains`` chains, in one
        program; frozen: the step sizes' geometric mean, the trajectory
        lengths' and inverse mass matrices' means, the first pilot dataset's final positions."""
        import blackjax
        import jax
        import jax.numpy as jnp
        import optax

        P = len(Y_pilot)
        keys = jax.random.split(jax.random.PRNGKey(seed), P + 1)
        inits = (jnp.asarray(self.x0, dtype=self.dtype)
                 + 0.1 * jax.random.normal(keys[0], (chains, self.dim), dtype=self.dtype))

        def adapt(key, y):
            lp = lambda x: self.logdensity(x, y)  # noqa: E731
            warm = blackjax.chees_adaptation(lp, chains, mass_matrix_estimation="diagonal",
                                             max_leapfrog_steps=self.max_steps,
                                             adaptation_info_fn=lambda *a: None)
            (states, params), _ = warm.run(key, inits, initial_step, optax.adam(learning_rate), steps)
            length = params["integration_steps_params"][0] * params["step_size"] \
                if "integration_steps_params" in params else params["trajectory_length"]
            return states.position, params["step_size"], length, params["inverse_mass_matrix"]

        # pilot datasets one after another (lax.map), their chains vmapped inside ChEES: one vmap
        # level, which an exported log density supports (``exported_logdensity``)
        t = time.perf_counter()
        compiled = jax.jit(lambda ks, Y: jax.lax.map(lambda a: adapt(*a), (ks, Y))).lower(
            keys[1:], jnp.asarray(Y_pilot, dtype=self.dtype)).compile()
        t1 = time.perf_counter()
        pos, step, length, imm = jax.block_until_ready(compiled(keys[1:], jnp.asarray(Y_pilot, dtype=self.dtype)))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        step = np.asarray(step, dtype=float)
        return FrozenHMC(float(np.exp(np.mean(np.log(step)))), float(np.mean(np.asarray(length))),
                         np.asarray(imm, dtype=float).mean(axis=0), np.asarray(pos, dtype=float)[0])

    def _compile(self, warmup: int, draws: int):
        import jax
        import jax.numpy as jnp
        from blackjax.mcmc import hmc

        kernel = hmc.build_kernel()
        logdensity, keep, max_steps = self.logdensity, self.keep, self.max_steps

        def init(x, y):
            return hmc.init(x, lambda z: logdensity(z, y))

        def step(key, state, y, eps, imm, n):
            return kernel(key, state, lambda z: logdensity(z, y), eps, imm, n)

        per_chain = jax.vmap(step, in_axes=(0, 0, 0, None, None, None))

        def run(keys, jitter_key, positions, Y, eps, length, imm):
            K, chains = keys.shape[:2]
            Yr = jnp.repeat(Y, chains, axis=0)
            states = jax.vmap(init)(jnp.tile(positions, (K, 1)), Yr)
            chain_keys = jax.vmap(lambda k: jax.random.split(k, warmup + draws))(keys.reshape((K * chains, -1)))
            jit_u = jax.random.uniform(jitter_key, (warmup + draws,), dtype=eps.dtype)

            def one(states, xs):
                ks, u = xs
                n = jnp.clip(jnp.ceil(u * length / eps), 1, max_steps).astype(jnp.int32)
                states, info = per_chain(ks, states, Yr, eps, imm, n)
                return states, (info.is_divergent, info.acceptance_rate, n)

            states, (_, _, n_warm) = jax.lax.scan(one, states, (jnp.swapaxes(chain_keys[:, :warmup], 0, 1),
                                                                jit_u[:warmup]))

            def draw(states, xs):
                states, (div, acc, n) = one(states, xs)
                return states, (jax.vmap(keep)(states.position), div, acc, n)

            _, (kept, div, acc, n_draw) = jax.lax.scan(draw, states, (jnp.swapaxes(chain_keys[:, warmup:], 0, 1),
                                                                      jit_u[warmup:]))
            kept = jnp.swapaxes(kept, 0, 1)  # (K * chains, draws, k)
            per = lambda a: a.reshape((K, chains) + a.shape[1:])  # noqa: E731
            grads = (n_warm.sum() + n_draw.sum()) * jnp.ones((K, chains), dtype=jnp.int32)
            return per(kept), per(div.T.sum(axis=1)), grads, per(acc.T.mean(axis=1))

        return jax.jit(run)

    def fit_kept(self, Y: np.ndarray, frozen: FrozenHMC, seed: int, warmup: int, draws: int,
                 timings: dict | None = None) -> dict:
        """``Y``: (K datasets, rows). Returns ``kept`` (K, chains, draws, k), ``divergences``
        and ``gradients`` (K, chains), ``acceptance`` (K, chains: mean over the draws)."""
        import jax
        import jax.numpy as jnp

        K, chains = len(Y), len(frozen.positions)
        key, jkey = jax.random.split(jax.random.PRNGKey(seed))
        keys = jax.random.split(key, K * chains).reshape(K, chains, -1)
        args = (keys, jkey, jnp.asarray(frozen.positions, dtype=self.dtype), jnp.asarray(Y, dtype=self.dtype),
                jnp.asarray(frozen.step_size, dtype=self.dtype), jnp.asarray(frozen.trajectory_length, dtype=self.dtype),
                jnp.asarray(frozen.inverse_mass_matrix, dtype=self.dtype))
        shape = (warmup, draws, K, chains, np.shape(Y)[1])
        t = time.perf_counter()
        if self._run is None or self._run[0] != shape:
            self._run = (shape, self._compile(warmup, draws).lower(*args).compile())
        t1 = time.perf_counter()
        kept, div, grads, acc = jax.block_until_ready(self._run[1](*args))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        return {"kept": np.asarray(kept, dtype=float), "divergences": np.asarray(div), "gradients": np.asarray(grads),
                "acceptance": np.asarray(acc)}


def constrained_fn(model, jm: JaxifiedModel, names: Sequence[str]) -> Callable:
    """x (flat unconstrained, ``jm``'s layout) -> the model variables ``names`` on their own
    (constrained) scale, flattened and concatenated: PyMC's own graph of each variable in terms
    of the value variables (as PyMC's JAX samplers compute deterministics). Imports PyMC."""
    import jax.numpy as jnp
    from pymc.sampling.jax import get_jaxified_graph

    outs = model.replace_rvs_by_values([model[n] for n in names])
    fn = get_jaxified_graph(inputs=model.value_vars, outputs=outs)
    shapes, sizes = jm.shapes, jm.sizes

    def f(x):
        parts, i = [], 0
        for n, sh in zip(sizes, shapes):
            parts.append(x[i:i + n].reshape(sh))
            i += n
        return jnp.concatenate([jnp.reshape(v, (-1,)) for v in fn(*parts)])

    return f


def stan_windows(steps: int, initial: int = 75, final: int = 50, first: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Stan's warm-up schedule (an initial fast window, slow windows doubling in length, a final
    fast window; the same proportions, 15% / 75% / 10%, where ``steps`` is under 150 + first):
    per step, whether it is in a slow window (the mass matrix accumulates) and whether a slow
    window ends there (the mass matrix is set and the step size's dual averaging restarts)."""
    steps = int(steps)
    slow, end = np.zeros(steps, dtype=bool), np.zeros(steps, dtype=bool)
    if steps < 20:
        return slow, end  # too short for a mass matrix: the step size alone adapts
    if initial + first + final > steps:
        initial, final = int(0.15 * steps), int(0.1 * steps)
        first = steps - initial - final
    start, size, stop = initial, first, steps - final
    while start < stop:
        # a window that would leave less than twice its size before the final buffer absorbs it
        if start + 3 * size > stop:
            size = stop - start
        slow[start:start + size] = True
        end[start + size - 1] = True
        start += size
        size *= 2
    return slow, end


@dataclass
class AdaptedHMC:
    """What each dataset's own warm-up adapted (``BatchedAdaptiveHMC``): per dataset, the step
    size, the trajectory length and the inverse mass matrix its draws used: ``inverse_mass_matrix``
    its diagonal (every coordinate); where a dense block was adapted, ``dense_idx`` (its
    coordinates) and ``dense_chol`` (K, m, m: the lower Cholesky factor of that block)."""

    step_size: np.ndarray  # (K,)
    trajectory_length: np.ndarray  # (K,)
    inverse_mass_matrix: np.ndarray  # (K, dim)
    dense_idx: np.ndarray | None = None  # (m,)
    dense_chol: np.ndarray | None = None  # (K, m, m)

    def dense_block(self) -> np.ndarray | None:
        """The dense block of each dataset's inverse mass matrix, (K, m, m), or None."""
        if self.dense_chol is None:
            return None
        return self.dense_chol @ np.swapaxes(self.dense_chol, -1, -2)


def block_metric(inverse_mass_diag, dense_chol, dense_idx):
    """A BlackJAX ``Metric`` (Gaussian Euclidean) whose inverse mass matrix is DENSE on the
    coordinates ``dense_idx`` (the block L L^T, ``dense_chol`` = L lower triangular) and DIAGONAL
    (``inverse_mass_diag``) on every other coordinate; the diagonal's entries at ``dense_idx``
    are not used. Costs O(m^2) a leapfrog step (two triangular products), not O(dim^2): the unit
    intercepts, most of a model's coordinates, stay on the diagonal."""
    import jax
    import jax.numpy as jnp
    from blackjax.mcmc.metrics import Metric
    from jax.scipy.linalg import solve_triangular

    imm, L, idx = inverse_mass_diag, dense_chol, dense_idx
    sd = jnp.sqrt(imm)

    def velocity(p):  # M^-1 p
        return (imm * p).at[idx].set(L @ (L.T @ p[idx]))

    def sample_momentum(key, position):
        z = jax.random.normal(key, jnp.shape(position), jnp.result_type(position))
        # M = L^-T L^-1 on the block: p = L^-T z has covariance M
        return (z / sd).at[idx].set(solve_triangular(L.T, z[idx], lower=False))

    def kinetic_energy(momentum, position=None):
        return 0.5 * jnp.dot(velocity(momentum), momentum)

    def check_turning(momentum_left, momentum_right, momentum_sum, position_left=None, position_right=None):
        rho = momentum_sum - (momentum_right + momentum_left) / 2
        return (jnp.dot(velocity(momentum_left), rho) <= 0) | (jnp.dot(velocity(momentum_right), rho) <= 0)

    def scale(position, element, *, inv, trans):
        # M^(1/2) = L^-T (block), 1 / sd (diagonal): inv -> its inverse L^T / sd
        if inv:
            return (element * sd).at[idx].set((L if trans else L.T) @ element[idx])
        return (element / sd).at[idx].set(solve_triangular(L if trans else L.T, element[idx], lower=trans))

    return Metric(sample_momentum, kinetic_energy, check_turning, scale)


def whiten(x, inverse_mass_diag, dense_chol, dense_idx):
    """Coordinates in the metric's whitened frame: L^-1 x on the dense block, x / sqrt(diag) elsewhere."""
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    w = x / jnp.sqrt(inverse_mass_diag)
    if dense_idx is None:
        return w
    return w.at[dense_idx].set(solve_triangular(dense_chol, x[dense_idx], lower=True))


def whiten_momentum(p, inverse_mass_diag, dense_chol, dense_idx):
    """The velocity M^-1 p in the whitened frame: L^T p on the dense block, sqrt(diag) p elsewhere."""
    import jax.numpy as jnp

    w = p * jnp.sqrt(inverse_mass_diag)
    if dense_idx is None:
        return w
    return w.at[dense_idx].set(dense_chol.T @ p[dense_idx])


def regularised_covariance(n, s1, s2):
    """Stan's regularised metric from a window's n draws (sums ``s1`` and of outer products or
    squares ``s2``): (n / (n + 5)) S + 1e-3 (5 / (n + 5)) I, S the sample covariance: it shrinks a
    short window's estimate towards a small multiple of the identity (and keeps it positive definite)."""
    import jax.numpy as jnp

    dense = s2.ndim == s1.ndim + 1
    nn = jnp.maximum(n, 1.0)
    mean_sq = (s1[..., :, None] * s1[..., None, :]) if dense else s1 ** 2
    cov = (s2 - mean_sq / nn[..., None, None] if dense else s2 - mean_sq / nn[..., None])
    shape = (..., None, None) if dense else (..., None)
    cov = cov / jnp.maximum(n - 1, 1.0)[shape]
    reg = 1e-3 * (5.0 / (n + 5.0))[shape]
    if dense:
        return (n / (n + 5.0))[shape] * cov + reg * jnp.eye(s1.shape[-1], dtype=s1.dtype)
    return (n / (n + 5.0))[shape] * cov + reg


def oas_towards_diagonal(cov, n):
    """A dense block's covariance shrunk towards its own diagonal: the Oracle Approximating
    Shrinkage (Chen, Wiesel, Eldar and Hero 2010; scikit-learn's ``oas``, whose formula this
    follows) applied to the block's correlation matrix R from ``n`` draws, R* = (1 - rho) R +
    rho I, rescaled by the block's own standard deviations. Why: a window of a few hundred draws
    estimates a block of hundreds of coordinates with a Marchenko-Pastur spread of eigenvalues
    (the smallest far too small), so the whitened posterior has directions several times wider
    than the rest and ChEES lengthens every trajectory to cross them; the variances themselves
    are kept. ``cov``: (..., m, m); ``n``: (...,). Returns the shrunk covariance and rho (...,)."""
    import jax.numpy as jnp

    sd = jnp.sqrt(jnp.diagonal(cov, axis1=-2, axis2=-1))
    R = cov / (sd[..., :, None] * sd[..., None, :])
    p = cov.shape[-1]
    alpha = jnp.mean(R ** 2, axis=(-2, -1))
    mu = jnp.trace(R, axis1=-2, axis2=-1) / p  # 1 up to rounding
    num = alpha + mu ** 2
    den = (n + 1.0) * (alpha - mu ** 2 / p)
    rho = jnp.where(den > 0, jnp.minimum(num / jnp.where(den > 0, den, 1.0), 1.0), 1.0)
    eye = jnp.eye(p, dtype=cov.dtype)
    shrunk = (1.0 - rho)[..., None, None] * R + (rho * mu)[..., None, None] * eye
    return shrunk * (sd[..., :, None] * sd[..., None, :]), rho


class BatchedAdaptiveHMC(BatchedChEES):
    """Jittered HMC over many datasets' chains in one JAX program in which EVERY DATASET ADAPTS
    ITS OWN step size, mass matrix and trajectory length in a warm-up (pooling its own
    chains), then samples with them frozen. A frozen batch-wide tuning (``BatchedChEES``) fails
    where datasets' posteriors differ (funnels, SBC's prior draws); NUTS under vmap waits at
    every step for the batch's longest tree.

    The warm-up, per step: every chain of dataset k integrates ceil(u L_k / eps_k) leapfrog
    steps (u ~ U(0, 1) shared by the batch, so the batch's trajectories differ only as the
    datasets' step sizes and lengths do). eps_k: dual averaging (Hoffman and Gelman 2014)
    towards ``target_accept`` of the mean acceptance of dataset k's chains (a divergent
    transition counts 0). M_k: Stan's windows (``stan_windows``); each slow window's pooled
    chain covariance, regularised as Stan does (``regularised_covariance``), becomes the inverse
    mass matrix and restarts eps_k's averaging: diagonal, or, given ``dense_idx``, DENSE on those
    coordinates (a model's global parameters) and diagonal on the rest (its unit intercepts;
    ``block_metric``); with ``shrink_dense``, each window's dense estimate is shrunk towards its
    diagonal first (``oas_towards_diagonal``). L_k: the ChEES criterion (Hoffman, Radul and Sountsov 2021;
    the whitened form of BlackJAX's ``chees_adaptation``) ascended by Adam in log L on
    dataset k's chains from the first slow window on (the initial fast window is the cold start's
    transient), its running average kept; with ``pool_length``, one L for the batch:
    the criterion's gradient averaged over every dataset (each centred on its own chains, in its
    own whitened frame, where datasets of one design have a similar shape), so the length rests
    on K x chains chains rather than one dataset's few (ChEES's estimate from 4 chains is noisy,
    and at the registered size it stalled near its start on half the datasets). A pooled program
    of fewer than ``min_pooled_chains`` chains (a lone frame form, a refit of one dataset) warms
    up with helper chains (``warmup_chains``: each dataset's chains plus more from its own cold
    start, so its step size, metric and length rest on at least that many) and samples with its
    first ``chains`` only: a registered-size dataset warmed up on its 4 chains alone ended with a
    twenty-fifth of the length 24 chains found, and bulk ESS 7 in 16,000 draws (the registered
    floor is ``settings.simulation_sampler.min_pooled_chains``; 0 here: none). ``tune`` (the
    parent's ChEES on pilot datasets) gives only where the warm-up starts: the chains' positions,
    eps, L and M."""

    def __init__(self, logdensity: Callable, dim: int, x0: np.ndarray, keep_idx: np.ndarray | None = None,
                 keep: Callable | None = None, float32: bool = False, max_steps: int = 1024,
                 target_accept: float = 0.8, learning_rate: float = 0.025, dense_idx: Sequence[int] | None = None,
                 shrink_dense: bool = False, pool_length: bool = False,
                 min_pooled_chains: int = 0):
        super().__init__(logdensity, dim, x0, keep_idx, keep, float32, max_steps)
        self.shrink_dense, self.pool_length = bool(shrink_dense), bool(pool_length)
        if int(min_pooled_chains) != min_pooled_chains or min_pooled_chains < 0:
            raise ValueError(f"min_pooled_chains must be a whole number >= 0 (0: no floor), got {min_pooled_chains!r}")
        self.min_pooled_chains = int(min_pooled_chains)
        self.target_accept, self.learning_rate = float(target_accept), float(learning_rate)
        idx = None if dense_idx is None else np.unique(np.asarray(dense_idx, dtype=np.int64))
        if idx is not None and (idx.size == 0 or idx[0] < 0 or idx[-1] >= self.dim):
            raise ValueError(f"dense_idx must name coordinates 0..{self.dim - 1}, got {dense_idx!r}")
        self.dense_idx = idx
        self._extend_run = None  # (shape, compiled program) of ``extend``

    def warmup_chains(self, datasets: int, chains: int) -> int:
        """Chains per dataset in the warm-up of ``datasets`` x ``chains``: ``chains``, or, where one
        pooled length would rest on fewer than ``min_pooled_chains`` chains, enough more that it
        does not (the extra ones are helpers, dropped before the draws)."""
        if not self.pool_length or datasets * chains >= self.min_pooled_chains:
            return int(chains)
        return -(-self.min_pooled_chains // datasets)

    def _compile(self, warmup: int, draws: int, kept_chains: int | None = None):
        """The program of a warm-up and draws; ``kept_chains``: how many of each dataset's chains
        the draws continue (the first ones; None: all)."""
        import jax
        import jax.numpy as jnp
        from blackjax.adaptation.step_size import dual_averaging_adaptation
        from blackjax.mcmc import hmc

        kernel = hmc.build_kernel()
        logdensity, keep, max_steps = self.logdensity, self.keep, self.max_steps
        target, lr = self.target_accept, self.learning_rate
        da_init0, da_update, da_final = dual_averaging_adaptation(target)
        idx = None if self.dense_idx is None else jnp.asarray(self.dense_idx)
        shrink, pool = self.shrink_dense, self.pool_length

        def da_init(eps):  # one averaging per dataset: every field a (K,) vector but the step count
            st = da_init0(eps)
            return st._replace(log_step_size_avg=jnp.zeros_like(eps), avg_error=jnp.zeros_like(eps))

        slow_np, end_np = stan_windows(warmup)
        # the length adapts from the first slow window on: ChEES's criterion assumes chains near their
        # stationary distribution, and in the cold start's transient the step size crashes (the
        # length is cut to max_steps x eps) while gradients of 1e5 fill Adam's memory for the rest
        # of the warm-up, which froze the length of a registered-size batch at a fifteenth of the others'
        first_adapt = int(np.argmax(slow_np)) if slow_np.any() else 0
        adapt_np = np.arange(warmup) >= first_adapt
        b1, b2, clip = 0.9, 0.999, 0.35  # Adam's defaults; BlackJAX's clip of a log-length update

        def step(key, state, y, eps, imm, chol, n):
            # a diagonal metric is BlackJAX's own (an array); a block metric is ``block_metric``
            metric = imm if idx is None else block_metric(imm, chol, idx)
            return kernel(key, state, lambda z: logdensity(z, y), eps, metric, n)

        # one vmap level over every (dataset, chain) pair: an exported log density supports one
        per_chain = jax.vmap(step, in_axes=(0, 0, 0, 0, 0, 0, 0))
        init_chain = jax.vmap(lambda x, y: hmc.init(x, lambda z: logdensity(z, y)))
        white_x = jax.vmap(lambda x, d, c: whiten(x, d, c, idx))
        white_p = jax.vmap(lambda p, d, c: whiten_momentum(p, d, c, idx))

        def run(keys, jitter_key, positions, Y, eps0, length0, imm0, chol0):
            K, chains = keys.shape[:2]
            dim = positions.shape[-1]
            m = chol0.shape[-1]
            Yr = jnp.repeat(Y, chains, axis=0)
            rep = lambda a: jnp.repeat(a, chains, axis=0)  # noqa: E731  per dataset -> per chain
            states = init_chain(positions.reshape(K * chains, dim), Yr)
            chain_keys = jax.vmap(lambda k: jax.random.split(k, warmup + draws))(keys.reshape((K * chains, -1)))
            chain_keys = jnp.swapaxes(chain_keys, 0, 1)
            jit_u = jax.random.uniform(jitter_key, (warmup + draws,), dtype=positions.dtype)

            # the dense factor is kept per chain (repeated once per window, not per transition)
            def transition_of(c):  # c chains per dataset
                Yc = jnp.repeat(Y, c, axis=0)

                def transition(states, ks, u, eps, length, imm, chol_r):
                    n = jnp.clip(jnp.ceil(u * length / eps), 1, max_steps).astype(jnp.int32)
                    r = lambda a: jnp.repeat(a, c, axis=0)  # noqa: E731
                    new, info = per_chain(ks, states, Yc, r(eps), r(imm), chol_r, r(n))
                    return new, info, n
                return transition

            transition = transition_of(chains)

            def set_metric(ops):
                s0, s1, s2, S2, imm, chol_r = ops
                new_imm = regularised_covariance(s0, s1, s2)
                if idx is None:
                    return new_imm, chol_r
                cov = regularised_covariance(s0, s1[:, idx], S2)
                if shrink:
                    cov = oas_towards_diagonal(cov, s0)[0]
                chol = jnp.linalg.cholesky(cov)
                # a window whose factor failed (not positive definite in rounding) keeps the last one
                ok = jnp.all(jnp.isfinite(chol), axis=(1, 2))
                chol = jnp.where(ok[:, None, None], chol, chol_r.reshape(K, chains, m, m)[:, 0])
                return new_imm, rep(chol)

            def warm(carry, xs):
                states, da, log_l, adam_m, adam_v, ma_l, imm, chol_r, s0, s1, s2, S2, t = carry
                ks, u, slow, end, adapt = xs
                eps, length = jnp.exp(da.log_step_size), jnp.exp(log_l)
                x_before = states.position
                states, info, _ = transition(states, ks, u, eps, length, imm, chol_r)
                acc = jnp.where(info.is_divergent, 0.0, info.acceptance_rate).reshape(K, chains)
                da = da_update(da, acc.mean(axis=1))
                # ChEES gradient in log L per dataset (acceptance-weighted over its chains, in M_k's whitened frame)
                w = acc
                imm_r = rep(imm)
                prop = white_x(info.proposal.position, imm_r, chol_r).reshape(K, chains, dim)
                # BlackJAX flips the proposal's momentum (the HMC involution): the end velocity is M^-1 (-p)
                vel = white_p(-info.proposal.momentum, imm_r, chol_r).reshape(K, chains, dim)
                init = white_x(x_before, imm_r, chol_r).reshape(K, chains, dim)
                pmean = (w[..., None] * prop).sum(1) / (w.sum(1)[:, None] + 1e-20)
                imean = init.mean(1)
                pc, ic = prop - pmean[:, None], init - imean[:, None]
                g_chain = ((pc ** 2).sum(-1) - (ic ** 2).sum(-1)) * (pc * vel).sum(-1)
                g = u * length * (w * g_chain).sum(1) / (w.sum(1) + 1e-20)
                g = jnp.where(jnp.isfinite(g), g, 0.0)
                if pool:  # one length for the batch: every dataset's criterion gradient averaged
                    g = jnp.broadcast_to(g.mean(), g.shape)
                adam_m = jnp.where(adapt, b1 * adam_m + (1 - b1) * g, adam_m)
                adam_v = jnp.where(adapt, b2 * adam_v + (1 - b2) * g ** 2, adam_v)
                ta = jnp.maximum(t - first_adapt, 1.0)  # Adam's steps so far
                upd = jnp.where(adapt, lr * (adam_m / (1 - b1 ** ta)) / (jnp.sqrt(adam_v / (1 - b2 ** ta)) + 1e-8),
                                0.0)
                lo, hi = jnp.log(eps), jnp.log(max_steps * eps)
                if pool:  # one length, kept within the batch's widest range: a dataset whose own range it
                    lo, hi = lo.min(), hi.max()  # leaves runs 1 or max_steps leapfrog steps (``transition``)
                log_l = jnp.clip(log_l + jnp.clip(upd, -clip, clip), lo, hi)
                weight = t ** -0.5
                ma_l = (1 - weight) * ma_l + weight * log_l
                # the slow windows' pooled moments per dataset
                xk = states.position.reshape(K, chains, dim)
                s0 = jnp.where(slow, s0 + chains, s0)
                s1 = jnp.where(slow, s1 + xk.sum(1), s1)  # plain sums: float64 (the sampler's default) keeps them exact enough
                s2 = jnp.where(slow, s2 + (xk ** 2).sum(1), s2)
                if idx is not None:
                    xb = xk[..., idx]
                    S2 = jnp.where(slow, S2 + jnp.einsum("kci,kcj->kij", xb, xb), S2)
                # the factorisation only where a window ends (the batch shares the schedule)
                imm, chol_r = jax.lax.cond(end, set_metric, lambda ops: (ops[4], ops[5]),
                                           (s0, s1, s2, S2, imm, chol_r))
                # a new metric: the step size's averaging restarts from the current step size
                restarted = da_init(jnp.exp(da.log_step_size))
                da = jax.tree_util.tree_map(lambda a, b: jnp.where(end, a, b), restarted, da)
                s0, s1, s2, S2 = (jnp.where(end, jnp.zeros_like(a), a) for a in (s0, s1, s2, S2))
                return (states, da, log_l, adam_m, adam_v, ma_l, imm, chol_r, s0, s1, s2, S2, t + 1), (
                    info.is_divergent.reshape(K, chains), jnp.broadcast_to(_n_max(eps, length, u, max_steps), ()))

            zK = jnp.zeros((K,), dtype=positions.dtype)
            chol_r0 = rep(chol0)
            carry = (states, da_init(eps0), jnp.log(length0), zK, zK, jnp.log(length0), imm0, chol_r0,
                     zK, jnp.zeros((K, dim), positions.dtype), jnp.zeros((K, dim), positions.dtype),
                     jnp.zeros((K, m, m), positions.dtype), jnp.asarray(1.0, positions.dtype))
            carry, (warm_div, warm_n) = jax.lax.scan(
                warm, carry, (chain_keys[:warmup], jit_u[:warmup], jnp.asarray(slow_np), jnp.asarray(end_np),
                              jnp.asarray(adapt_np)))
            states, da, _, _, _, ma_l, imm, chol_r = carry[:8]
            eps = da_final(da) if warmup else eps0
            length = jnp.clip(jnp.exp(ma_l), eps, max_steps * eps) if warmup else length0
            warm_div = warm_div.sum(axis=0)
            C = chains if kept_chains is None else kept_chains
            draw_keys = chain_keys[warmup:]
            if C < chains:  # the warm-up's helper chains end here: each dataset's first C continue
                def first(a):
                    return a.reshape((K, chains) + a.shape[1:])[:, :C].reshape((K * C,) + a.shape[1:])
                states, chol_r = jax.tree_util.tree_map(first, states), first(chol_r)
                draw_keys = jnp.swapaxes(first(jnp.swapaxes(draw_keys, 0, 1)), 0, 1)
                warm_div = warm_div[:, :C]
            sample = transition_of(C)

            def draw(states, xs):
                ks, u = xs
                states, info, n = sample(states, ks, u, eps, length, imm, chol_r)
                return states, (jax.vmap(keep)(states.position), info.is_divergent, info.acceptance_rate, n.max())

            states, (kept, div, acc, n_draw) = jax.lax.scan(draw, states, (draw_keys, jit_u[warmup:]))
            kept = jnp.swapaxes(kept, 0, 1)  # (K * C, draws, k)
            per = lambda a: a.reshape((K, C) + a.shape[1:])  # noqa: E731
            # leapfrog steps the batch ran (every chain waits for the longest trajectory of a step)
            grads = (warm_n.sum() + n_draw.sum()) * jnp.ones((K, C), dtype=jnp.int32)
            return (per(kept), per(div.T.sum(axis=1)), grads, per(acc.T.mean(axis=1)), eps, length, imm,
                    per(chol_r)[:, 0], warm_div, per(states.position))

        return jax.jit(run)

    def _start_chol(self, imm: np.ndarray) -> np.ndarray:
        """(K, m, m): the dense block's starting factor, the diagonal's square root on it (or (K, 0, 0))."""
        if self.dense_idx is None:
            return np.zeros((len(imm), 0, 0))
        return np.stack([np.diag(np.sqrt(d[self.dense_idx])) for d in imm])

    def _adapted(self, eps, length, imm, chol) -> AdaptedHMC:
        return AdaptedHMC(np.asarray(eps, dtype=float), np.asarray(length, dtype=float), np.asarray(imm, dtype=float),
                          self.dense_idx, None if self.dense_idx is None else np.asarray(chol, dtype=float))

    def fit_kept(self, Y: np.ndarray, start: FrozenHMC, seed: int, warmup: int, draws: int,
                 timings: dict | None = None) -> dict:
        """``Y``: (K datasets, rows); ``start``: where every dataset's warm-up starts (``tune``).
        Returns ``kept`` (K, chains, draws, k), ``divergences`` (draws only), ``gradients`` and
        ``acceptance`` (K, chains), ``warmup_divergences`` (K, chains), and ``adapted``
        (``AdaptedHMC``: each dataset's step size, trajectory length and mass matrix)."""
        import jax
        import jax.numpy as jnp

        K, chains = len(Y), len(start.positions)
        R = self.warmup_chains(K, chains) if warmup else chains
        key, jkey = jax.random.split(jax.random.PRNGKey(seed))
        keys = jax.random.split(key, K * R).reshape(K, R, -1)
        dt = self.dtype
        imm0 = np.broadcast_to(start.inverse_mass_matrix, (K, self.dim))
        positions = np.asarray(start.positions, dtype=float)
        if R > chains:  # the helpers start cold about the model's initial point (seeded by the fit's seed)
            positions = np.concatenate([positions, FrozenHMC.cold_start(self.x0, R - chains, seed).positions])
        args = (keys, jkey, jnp.asarray(np.broadcast_to(positions, (K,) + positions.shape), dtype=dt),
                jnp.asarray(Y, dtype=dt), jnp.full((K,), start.step_size, dtype=dt),
                jnp.full((K,), start.trajectory_length, dtype=dt), jnp.asarray(imm0, dtype=dt),
                jnp.asarray(self._start_chol(imm0), dtype=dt))
        shape = (warmup, draws, K, chains, R, np.shape(Y)[1])
        t = time.perf_counter()
        if self._run is None or self._run[0] != shape:
            self._run = (shape, self._compile(warmup, draws, chains).lower(*args).compile())
        t1 = time.perf_counter()
        kept, div, grads, acc, eps, length, imm, chol, wdiv, last = jax.block_until_ready(self._run[1](*args))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        return {"kept": np.asarray(kept, dtype=float), "divergences": np.asarray(div), "gradients": np.asarray(grads),
                "acceptance": np.asarray(acc), "warmup_divergences": np.asarray(wdiv),
                "adapted": self._adapted(eps, length, imm, chol), "positions": np.asarray(last, dtype=float)}

    def extend(self, Y: np.ndarray, fit: dict, seed: int, draws: int, timings: dict | None = None) -> dict:
        """The convergence remedy on the accelerator path: ``draws`` more draws of each dataset
        of ``fit`` (``fit_kept``'s result for the rows of ``Y``), every chain continuing from
        its last position with its dataset's adapted step size, length and mass matrix (no
        warm-up: the same frozen kernel, so the continued chains are one chain each). Returns
        ``fit`` with the draws appended and the divergences, gradients added."""
        import jax
        import jax.numpy as jnp

        K, chains = fit["positions"].shape[:2]
        ad = fit["adapted"]
        key, jkey = jax.random.split(jax.random.PRNGKey(seed))
        keys = jax.random.split(key, K * chains).reshape(K, chains, -1)
        dt = self.dtype
        chol = ad.dense_chol if ad.dense_chol is not None else self._start_chol(ad.inverse_mass_matrix)
        args = (keys, jkey, jnp.asarray(fit["positions"], dtype=dt), jnp.asarray(Y, dtype=dt),
                jnp.asarray(ad.step_size, dtype=dt), jnp.asarray(ad.trajectory_length, dtype=dt),
                jnp.asarray(ad.inverse_mass_matrix, dtype=dt), jnp.asarray(chol, dtype=dt))
        shape = (draws, K, chains, np.shape(Y)[1])
        t = time.perf_counter()
        # a batch extended twice runs one program (compiled once per shape, as fit_kept's)
        if self._extend_run is None or self._extend_run[0] != shape:
            self._extend_run = (shape, self._compile(0, draws).lower(*args).compile())
        t1 = time.perf_counter()
        kept, div, grads, acc, _, _, _, _, _, last = jax.block_until_ready(self._extend_run[1](*args))
        if timings is not None:
            timings["compile_s"], timings["run_s"] = t1 - t, time.perf_counter() - t1
        n0 = fit["kept"].shape[2]
        return {**fit, "kept": np.concatenate([fit["kept"], np.asarray(kept, dtype=float)], axis=2),
                "divergences": fit["divergences"] + np.asarray(div), "gradients": fit["gradients"] + np.asarray(grads),
                "acceptance": (fit["acceptance"] * n0 + np.asarray(acc) * draws) / (n0 + draws),
                "positions": np.asarray(last, dtype=float)}


#: The per-dataset arrays of an adaptive fit (``BatchedAdaptiveHMC.fit_kept`` / ``extend``).
FIT_ARRAYS = ("kept", "divergences", "gradients", "acceptance", "warmup_divergences", "positions")


def fit_of_datasets(fit: dict, rows) -> dict:
    """The part of an adaptive fit (``BatchedAdaptiveHMC.fit_kept`` or ``extend``) that belongs
    to the datasets at ``rows``: every per-dataset array and each dataset's adapted kernel, so
    ``extend`` continues only those datasets' chains (the convergence remedy extends a batch's
    failing datasets, not the datasets that already meet the rule)."""
    rows = np.asarray(rows, dtype=np.int64)
    ad = fit["adapted"]
    return {**fit, **{k: np.asarray(fit[k])[rows] for k in FIT_ARRAYS if k in fit},
            "adapted": AdaptedHMC(ad.step_size[rows], ad.trajectory_length[rows], ad.inverse_mass_matrix[rows],
                                  ad.dense_idx, None if ad.dense_chol is None else ad.dense_chol[rows])}


def save_fit(fit: dict, path, fingerprint: str, meta: dict | None = None) -> None:
    """Write an adaptive fit (``fit_kept``'s or ``extend``'s result) to ``path`` (.npz) with the
    ``fingerprint`` of what produced it, so a process stopped between chunks of draws resumes
    where it stopped (``load_fit``): ``extend`` continues every chain from its saved position
    with its saved kernel, so the resumed draws are the draws an unbroken run makes. ``meta``
    (JSON: the seconds spent so far) comes back as the loaded fit's ``"meta"``. Written to a
    temporary file and renamed: a kill mid-write leaves the previous checkpoint whole."""
    path = Path(path)
    ad = fit["adapted"]
    arrays = {k: np.asarray(fit[k]) for k in FIT_ARRAYS if k in fit}
    arrays.update({"adapted_step_size": ad.step_size, "adapted_trajectory_length": ad.trajectory_length,
                   "adapted_inverse_mass_matrix": ad.inverse_mass_matrix, "fingerprint": np.asarray(fingerprint),
                   "meta": np.asarray(json.dumps(meta or {}, sort_keys=True))})
    if ad.dense_chol is not None:
        arrays.update(adapted_dense_idx=ad.dense_idx, adapted_dense_chol=ad.dense_chol)
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:  # an open file: np.savez would add ".npz" to the temporary name
        np.savez(f, **arrays)
    part.replace(path)


def load_fit(path, fingerprint: str) -> dict | None:
    """The fit ``save_fit`` wrote at ``path``, or None where there is none. A checkpoint of
    another run (another fingerprint: other datasets, seed, kernel options or export) is refused
    with an error naming the file, never continued: its chains are not this run's."""
    path = Path(path)
    if not path.is_file():
        return None
    with np.load(path) as z:
        saved = str(z["fingerprint"])
        if saved != fingerprint:
            raise ValueError(f"{path}: a checkpoint of another run (fingerprint {saved[:12]}, this run's "
                             f"{fingerprint[:12]}); delete it to start afresh, or resume with the run's own "
                             f"options and export")
        fit = {k: z[k] for k in FIT_ARRAYS if k in z.files}
        dense = "adapted_dense_chol" in z.files
        fit["adapted"] = AdaptedHMC(z["adapted_step_size"], z["adapted_trajectory_length"],
                                    z["adapted_inverse_mass_matrix"], z["adapted_dense_idx"] if dense else None,
                                    z["adapted_dense_chol"] if dense else None)
        fit["meta"] = json.loads(str(z["meta"]))
    return fit


@dataclass
class Remedied:
    """What ``extend_missing`` leaves: each dataset's contrast draws (name -> one (chains,
    draws) array per dataset; an extended dataset has more draws), divergences and gradient
    evaluations per chain (its extensions' included), the datasets each round extended, the
    extensions' seconds, and why a round was not run (None: none was stopped)."""

    draws: dict[str, list[np.ndarray]]
    divergences: list[np.ndarray]
    gradients: list[np.ndarray]
    extended: list[int]
    run_s: float = 0.0
    compile_s: float = 0.0
    stopped: str | None = None


def extend_missing(sampler, Y: np.ndarray, fit: dict, contrasts: Callable[[np.ndarray], dict],
                   missing: Callable[[dict, list], np.ndarray], seed: int, draws: int, rounds: int,
                   stop: Callable[[int], str | None] = lambda r: None) -> Remedied:
    """The registered convergence remedy (6.1, D7) on a batch fitted together (``fit``: an
    adaptive sampler's ``fit_kept`` for the rows of ``Y``): while ``missing(draws, divergences)``
    flags a dataset (it misses the rule on a reported contrast), ONLY THE FLAGGED DATASETS
    continue their chains, each with its own adapted kernel, for ``draws`` more draws in a
    program of their own (seed ``seed + r``), up to ``rounds`` times; every dataset is kept
    whatever it reaches. A dataset that meets the rule keeps its first draws, whichever datasets
    share its batch. ``contrasts(kept)`` gives name -> (k, chains, draws) of kept draws (k,
    chains, draws, d); ``stop(r)``: why round ``r`` is not to run (a deadline), or None."""
    out = Remedied({name: list(x) for name, x in contrasts(fit["kept"]).items()},
                   list(np.asarray(fit["divergences"])), list(np.asarray(fit["gradients"])), [])
    part, at = fit, np.arange(len(Y))
    for r in range(rounds):
        flagged = np.asarray(missing(out.draws, out.divergences), dtype=bool)
        if not flagged.any():
            break
        why = stop(r)
        if why:
            out.stopped = f"round {r + 1} of {rounds} not run: {why}"
            break
        rows = np.flatnonzero(flagged[at])  # those of the extended part that still miss the rule
        t: dict = {}
        part = sampler.extend(Y[at[rows]], fit_of_datasets(part, rows), seed + r, draws, timings=t)
        at = at[rows]
        for name, x in contrasts(part["kept"]).items():
            for i, k in enumerate(at):
                out.draws[name][k] = x[i]
        for i, k in enumerate(at):  # extend's counts are cumulative: they replace the dataset's
            out.divergences[k] = np.asarray(part["divergences"])[i]
            out.gradients[k] = np.asarray(part["gradients"])[i]
        out.extended.append(len(at))
        out.run_s, out.compile_s = out.run_s + t["run_s"], out.compile_s + t["compile_s"]
    return out


def _n_max(eps, length, u, max_steps):
    """The leapfrog steps a batch's transition runs: its longest trajectory."""
    import jax.numpy as jnp

    return jnp.clip(jnp.ceil(u * length / eps), 1, max_steps).max().astype(jnp.int32)
