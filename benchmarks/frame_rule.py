"""Test (a)'s scan: datasets on which the former non-centred default misses the convergence rule,
fitted in both frame forms and by the rule (D3b; README "The frame parametrisation rule and the
convergence remedy", Measured).

Run (from the repository root; the machine is shared, so at low priority; ~15 min on 2 cores):

    nice -n 10 .venv/bin/python benchmarks/frame_rule.py

Data: ``fear_assets_tests/test_frame_rule.benchmark_frames`` (``benchmarks/fit.py``'s generator)
at ten frames x four depths x three rotations x two orders (1,440 rows), unit SD 0.1, every
frame effect of one SD against one residual scale, in three pilot-like cases (0.3/0.3,
0.25/0.4, 0.4/0.5), four datasets each (``k`` = 0-3); each dataset's draws and the fit's seed
are derived from the master seed as in the test. Each dataset is fitted centred first, then
non-centred where the centred fit had no divergence (a centred divergence is not mended by the
remedy's longer runs), at the registered sampler (one run, no remedy). One JSON line per
dataset and fit: the rule's smallest SD / standard-error ratio and pick, divergences, H1-H3
bulk ESS, tail ESS, R-hat and whether every contrast meets the rule. No timing is asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fear_assets.models.data import levels_of, prepared  # noqa: E402
from fear_assets.models.fits import convergence_problems, fit_cells  # noqa: E402
from fear_assets.models.parametrisation import frame_parametrisation, frame_scales  # noqa: E402
from fear_assets.models.primary_model import Fitter, Priors  # noqa: E402
from fear_assets.core.hashing import derived_seed  # noqa: E402
from fear_assets.core.settings import load_settings  # noqa: E402
from fear_assets_tests.test_frame_rule import FEARS, INFORMATIVE, _contrast_rows, benchmark_frames  # noqa: E402

CASES = ((0.3, 0.3), (0.25, 0.4), (0.4, 0.5))  # (every frame effect's SD, residual scale)
DATASETS = range(4)


def main() -> None:
    s = load_settings()
    rule, sampler, depths = s.convergence, s.sampler, list(INFORMATIVE["depths"])
    seed = derived_seed(s.master_seed, "test_frame_rule", "fit") % 2**31
    fitters = {form: Fitter(Priors.from_settings(s), sampler.draws, sampler.tune, sampler.chains, frames=form)
               for form in ("centred", "non_centred")}
    for k in DATASETS:
        for sd, residual in CASES:
            table = benchmark_frames((sd,) * 6, INFORMATIVE["unit_sd"], residual, depths=INFORMATIVE["depths"],
                                     seed=derived_seed(s.master_seed, "test_frame_rule", "a", k) % 2**31)
            d = prepared(table, levels_of(table, FEARS))
            scales = frame_scales(d.y, d.X, d.Z, d.frame, d.n_frames)
            head = {"k": k, "frame_sd": sd, "residual": residual, "min_ratio": round(min(scales.ratios()), 2),
                    "rule": frame_parametrisation(d, s.fitting.frame_parametrisation)}
            for form in ("centred", "non_centred"):
                fit = fit_cells(fitters[form], table, FEARS, depths, seed, "primary")
                rows = [row for row, _ in _contrast_rows(s, fit)]
                print(json.dumps({**head, "form": form, "divergences": fit.diagnostics["divergences"],
                                  **{r["contrast"]: [round(r["ess_bulk"]), round(r["ess_tail"]), round(r["rhat"], 3)]
                                     for r in rows},
                                  "meets_rule": not any(convergence_problems(r, rule) for r in rows)}), flush=True)
                if fit.diagnostics["divergences"]:
                    break


if __name__ == "__main__":
    main()
