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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class Reference:
    step_size: float
    inverse_mass_matrix: np.ndarray
    positions: np.ndarray  # (chains, dim): where each dataset's chains start


class VectorisedNUTS:
    """One JAX log density of the registered model for a design; ``fit_many`` samples K
    datasets' outcomes at once. ``keep`` names the model variables whose draws are returned
    (untransformed ones: ``intercept``, ``beta``)."""

    def __init__(self, model, keep: Sequence[str] = ("intercept", "beta"), float32: bool = False):
        import jax
        import pytensor
        import pytensor.tensor as pt
        from pymc.sampling.jax import get_jaxified_graph

        jax.config.update("jax_enable_x64", not float32)
        self.dtype = np.float32 if float32 else np.float64
        y_shared = model["y"]
        y_in = pt.vector("y_in")
        logp = pytensor.graph.replace.graph_replace(model.logp(jacobian=True), {y_shared: y_in}, strict=False)
        values = model.value_vars
        fn = get_jaxified_graph(inputs=[*values, y_in], outputs=[logp])
        point = model.initial_point()
        self.names = [v.name for v in values]
        self.shapes = [np.asarray(point[n]).shape for n in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.sizes)
        self.x0 = np.concatenate([np.asarray(point[n], dtype=float).reshape(-1) for n in self.names])
        offsets = np.cumsum([0] + self.sizes)
        self.slices = {n: slice(int(offsets[i]), int(offsets[i + 1])) for i, n in enumerate(self.names)}
        missing = [k for k in keep if k not in self.slices]
        if missing:
            raise ValueError(f"variables {missing} are not untransformed value variables of the model "
                             f"({self.names}): keep only those")
        self.keep = tuple(keep)
        keep_idx = np.concatenate([np.arange(self.dim)[self.slices[k]] for k in self.keep])
        self.keep_idx = keep_idx
        sizes, shapes = self.sizes, self.shapes

        def logdensity(x, y):
            parts, i = [], 0
            for n, sh in zip(sizes, shapes):
                parts.append(x[i:i + n].reshape(sh))
                i += n
            return fn(*parts, y)[0]

        self.logdensity = logdensity
        self._run = None

    # -- reference adaptation on one dataset --------------------------------------------------
    def reference(self, y: np.ndarray, seed: int, steps: int, chains: int, dense: bool = True) -> Reference:
        """BlackJAX window adaptation on one dataset, one run per chain (vmapped); the mass
        matrices and step sizes are averaged over chains (log scale for the step size)."""
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

        pos, step, imm = jax.jit(jax.vmap(adapt))(keys[1:], inits)
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

        # datasets x chains: vmap over chains inside, datasets outside
        per_dataset = jax.vmap(chain, in_axes=(0, 0, None, None, None))
        return jax.jit(jax.vmap(per_dataset, in_axes=(0, None, 0, None, None)))

    def fit_many(self, Y: np.ndarray, ref: Reference, seed: int, warmup: int, draws: int,
                 target_accept: float = 0.8) -> dict:
        """``Y``: (K datasets, rows). Returns kept draws (K, chains, draws, kept dim), the
        divergences (K, chains), gradient evaluations (K, chains) and the final step sizes."""
        import jax
        import jax.numpy as jnp

        key = (warmup, draws, target_accept)
        if self._run is None or self._run[0] != key:
            self._run = (key, self._compile(warmup, draws, target_accept))
        run = self._run[1]
        K, chains = len(Y), len(ref.positions)
        keys = jax.random.split(jax.random.PRNGKey(seed), K * chains).reshape(K, chains, -1)
        kept, div, grads, step = run(keys, jnp.asarray(ref.positions, dtype=self.dtype),
                                     jnp.asarray(Y, dtype=self.dtype), jnp.asarray(ref.step_size, dtype=self.dtype),
                                     jnp.asarray(ref.inverse_mass_matrix, dtype=self.dtype))
        kept = np.asarray(kept, dtype=float)
        out = {"divergences": np.asarray(div), "gradients": np.asarray(grads), "step_size": np.asarray(step)}
        i = 0
        for name in self.keep:
            n = self.sizes[self.names.index(name)]
            out[name] = kept[..., i:i + n].reshape(kept.shape[:3] + self.shapes[self.names.index(name)])
            i += n
        return out
