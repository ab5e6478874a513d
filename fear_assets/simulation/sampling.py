"""A cheaper sampler set-up for the simulation, kept only where it matches a long run (6.3).

Every simulated dataset of a family shares the design, so the posterior geometry barely
changes between datasets. ``WarmStartFitter`` compiles the registered model once per shape
(as ``Fitter`` does) and starts each dataset's chains from a reference fit: its posterior
mean in the unconstrained space (nutpie's ``init_mean``) and its adapted step size
(``initial_step``), with a shorter tuning phase. The model and priors are untouched.
``benchmarks/power.py`` measures whether its 99% HDIs stay within 0.02 of a long run on the
same datasets; it is used only where that holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fear_assets.analysis.primary_model import Fitter, PrimaryData, build_model, data_updates, one_blas_thread, same_shape


@dataclass(frozen=True)
class WarmStart:
    init_mean: np.ndarray  # unconstrained posterior mean of the reference fit
    step_size: float  # the reference fit's final adapted step size (mean over chains)


def warm_start_from(idata) -> WarmStart:
    """Warm start from a fit sampled with ``store_unconstrained=True``."""
    stats = idata.sample_stats
    if "unconstrained_draw" not in stats:
        raise ValueError("the reference fit has no unconstrained draws: sample it with store_unconstrained=True")
    u = stats["unconstrained_draw"].values
    mean = u.reshape(-1, u.shape[-1]).mean(axis=0)
    return WarmStart(mean, float(stats["step_size"].values[:, -1].mean()))


class WarmStartFitter(Fitter):
    """``Fitter`` with warm-started chains (see module docstring); ``warm`` None samples cold."""

    def __init__(self, priors, draws: int, tune: int, chains: int, warm: WarmStart | None = None,
                 store_unconstrained: bool = False):
        super().__init__(priors, draws, tune, chains)
        self.warm, self.store_unconstrained = warm, store_unconstrained

    def compiled_for(self, d: PrimaryData):
        import nutpie

        compiled = next((c for ref, c in self._compiled if same_shape(ref, d)), None)
        if compiled is None:
            compiled = nutpie.compile_pymc_model(build_model(d, self.priors))
            self._compiled.append((d, compiled))
            self.compilations += 1
        return compiled

    def fit(self, d: PrimaryData, seed: int, fixed_sd: float | None = None):
        import nutpie

        sd = self.priors.fixed_sd if fixed_sd is None else float(fixed_sd)
        compiled = self.compiled_for(d).with_data(**data_updates(d), fixed_sd=np.asarray(sd, dtype="float64"))
        extra = {}
        if self.warm is not None:
            extra = {"init_mean": self.warm.init_mean, "initial_step": self.warm.step_size}
        if self.store_unconstrained:
            extra["store_unconstrained"] = True
        with one_blas_thread():
            return nutpie.sample(compiled, draws=self.draws, tune=self.tune, chains=self.chains, seed=seed,
                                 progress_bar=False, low_rank_modified_mass_matrix=True, **extra)
