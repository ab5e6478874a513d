"""Validation of a fitting path that can fail (6.3, issue 28 item 3): a candidate sampler's
reported contrasts against a long run of the registered sampler on the same datasets, in Monte
Carlo standard-error units, its labels, and simulation-based calibration. Pure (NumPy, SciPy).

The rule. For every dataset and reported contrast, the posterior mean, SD and 99% HDI
endpoints of the two runs differ by z = (a - b) / sqrt(MCSE_a^2 + MCSE_b^2) (ArviZ's MCSE
estimators of the mean and SD; an HDI endpoint's by a block bootstrap of the whole HDI, seeded:
``diagnostics.summary_with_mcse``), the reference's endpoints taken at the candidate's length
(``diagnostics.hdi_at_length``: fewer draws give a narrower HDI). Two correct samplers give z
about N(0, 1); an absolute bound (the last benchmark's 0.02) is below the Monte
Carlo error of a 99% HDI endpoint at ESS 400 and fails correct runs. The pass bound is
|z| <= 3 for every statistic, raised to the Bonferroni bound of a 1% family-wise error where
the number of comparisons m makes 3 a likely false alarm (m >= 4: z_crit = Phi^-1(1 - 0.005 / m),
4.05 at m = 192). A label may differ only where an HDI endpoint of either run lies within 2 MCSE
of a decision boundary (0, +-ROPE); any other flip fails. SBC: ranks of each quantity's prior
draw among its (thinned) posterior draws, uniform under a calibrated sampler (chi-square).
``verdict`` joins the parts: a candidate passes only where every part ran and passed and every
comparison rests on a reference that itself meets the convergence rule;
``verdict_across_scenarios`` passes a sampler at registered size only where every registered
scenario passed on its 64 datasets.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from scipy.special import ndtri

from fear_assets.models.decision import label
from fear_assets.simulation import diagnostics as dg


def z_bound(m: int, family_alpha: float = 0.01) -> float:
    """The pass bound on |z| for ``m`` comparisons: 3, or the Bonferroni bound if larger."""
    return float(max(3.0, ndtri(1 - family_alpha / (2 * max(int(m), 1)))))


def compare_contrast(short: np.ndarray, long: np.ndarray, hdi_prob: float, rope: float,
                     rng: np.random.Generator) -> dict:
    """One dataset's contrast, (chains, draws) in each run: the four z-scores, both labels and
    whether a differing label sits within 2 MCSE of a boundary (0, +-rope); ``rng``: the HDI
    endpoints' bootstrap."""
    a, b = dg.summary_with_mcse(short, hdi_prob, rng), dg.summary_with_mcse(long, hdi_prob, rng)
    la, lb = label(a["hdi_low"], a["hdi_high"], rope).label, label(b["hdi_low"], b["hdi_high"], rope).label
    boundaries = (0.0, -rope, rope)
    # the endpoints against the reference's at the candidate's length: the HDI's own bias cancels
    at_length = dg.hdi_at_length(long, hdi_prob, np.size(short) // np.shape(long)[0], rng)
    z = dg.z_scores(a, {**b, **{k: at_length[k] for k in ("hdi_low", "hdi_high", "mcse_hdi_low", "mcse_hdi_high")}})
    return {"z": z, "label": la, "reference_label": lb, "flip": la != lb,
            "near_boundary": dg.near_boundary(a, boundaries) or dg.near_boundary(b, boundaries),
            "candidate": a, "reference": b}


def bootstrap_stream(seed: int, dataset: int, contrast: str) -> np.random.Generator:
    """The HDI endpoints' bootstrap stream of one dataset's contrast: from the registered master
    ``seed``, the dataset's own number and the contrast, so a row's MCSE does not depend on which
    other rows are scored with it, and every comparison of the same row draws the same stream."""
    return np.random.default_rng([int(seed), int(dataset), *contrast.encode()])


def shared_shifts(rows: Sequence[Mapping]) -> dict:
    """Per contrast and statistic of ``compare_runs``-shaped rows, the mean z in units of its
    standard error (sqrt(n) x mean over the n rows): about N(0, 1) for a correct sampler, so a
    small bias shared by every dataset shows here long before one row's |z| passes the bound."""
    return {f"{name}.{st}": float(np.sqrt(len(zc)) * np.mean(zc)) for name in dict.fromkeys(r["contrast"] for r in rows)
            for st in dg.STATISTICS for zc in [[r[f"z_{st}"] for r in rows if r["contrast"] == name]]}


def compare_runs(short: Mapping[str, np.ndarray], long: Mapping[str, np.ndarray], hdi_prob: float,
                 ropes: Mapping[str, float], seed: int, datasets: Sequence[int] | None = None) -> dict:
    """Every contrast of every dataset: ``short``/``long`` map a contrast to (K, chains, draws)
    (or K arrays of (chains, draws)); ``seed`` (the registered master seed): the HDI endpoints'
    bootstrap, one stream per contrast and dataset, so a row's z does not depend on the others;
    ``datasets``: the K datasets' own numbers (default 0..K-1), which name the rows and their
    streams, so runs of disjoint sets of datasets scored together give each row as scored alone.
    Returns the largest |z| per statistic and overall, the bound, the label flips (all, and
    those not near a boundary) and ``passed``; beside them, not judged, each contrast's and
    statistic's mean z over the datasets in units of its standard error (sqrt(K) x mean): a
    small bias shared by every dataset shows there long before any one dataset's |z| passes the
    bound."""
    K = len(next(iter(short.values())))
    numbers = list(range(K)) if datasets is None else [int(k) for k in datasets]
    if len(numbers) != K or len(set(numbers)) != K or min(numbers, default=0) < 0:
        raise ValueError(f"datasets {numbers}: give {K} distinct non-negative numbers, one per dataset of `short`")
    rows = []
    for name in short:
        for i, k in enumerate(numbers):
            c = compare_contrast(short[name][i], long[name][i], hdi_prob, ropes[name], bootstrap_stream(seed, k, name))
            rows.append({"contrast": name, "dataset": k, **{f"z_{s}": c["z"][s] for s in dg.STATISTICS},
                         "label": c["label"], "reference_label": c["reference_label"], "flip": c["flip"],
                         "near_boundary": c["near_boundary"]})
    zs = np.array([[r[f"z_{s}"] for s in dg.STATISTICS] for r in rows])
    bound = z_bound(zs.size)
    far = [r for r in rows if r["flip"] and not r["near_boundary"]]
    max_z = {s: float(np.abs(zs[:, i]).max()) for i, s in enumerate(dg.STATISTICS)}
    shared = shared_shifts(rows)
    return {"comparisons": int(zs.size), "z_bound": bound, "max_abs_z": max_z, "shared_shift_z": shared,
            "max_shared_shift_z": max(map(abs, shared.values())),
            "max_endpoint_z": max(max_z["hdi_low"], max_z["hdi_high"]), "max_z": float(np.abs(zs).max()),
            "label_flips": int(sum(r["flip"] for r in rows)), "label_flips_not_near_boundary": len(far),
            "passed": bool(np.abs(zs).max() <= bound and not far), "rows": rows}


def run_to_run_spread(runs: Sequence[Mapping[str, Sequence[np.ndarray]]], hdi_prob: float, seed: int,
                      datasets: Sequence[int], confidence: float = 0.95) -> dict:
    """Whether a sampler's MCSEs are its run-to-run spread: ``runs`` are S >= 2 fits of the same
    datasets by the same sampler with other seeds (contrast -> K arrays (chains, draws)). Per
    statistic (``diagnostics.STATISTICS``), over every dataset and contrast: the spread ratio
    sqrt(sum of the S estimates' sample variances / sum of their mean squared MCSE), with its
    ``confidence`` interval (chi-square with K x contrasts x (S - 1) degrees of freedom). About 1
    where the MCSE is right; above 1, item 3(a)'s z against a fixed reference is too large by
    that factor for this sampler, so its bound would fail correct fits. The MCSE as
    ``compare_runs`` draws it (``bootstrap_stream``). Pure."""
    from scipy.stats import chi2  # not at import: loading the definitions must not pull scipy.stats in

    S = len(runs)
    if S < 2:
        raise ValueError(f"runs: give at least two fits of the same datasets, got {S}")
    names = list(runs[0])
    var_sum = dict.fromkeys(dg.STATISTICS, 0.0)
    mcse2_sum = dict.fromkeys(dg.STATISTICS, 0.0)
    rows = []
    for name in names:
        for i, k in enumerate(datasets):
            summaries = [dg.summary_with_mcse(run[name][i], hdi_prob, bootstrap_stream(seed, k, name)) for run in runs]
            row = {"contrast": name, "dataset": int(k)}
            for st in dg.STATISTICS:
                x = np.array([a[st] for a in summaries])
                m2 = np.array([a[f"mcse_{st}"] ** 2 for a in summaries])
                var_sum[st] += float(x.var(ddof=1))
                mcse2_sum[st] += float(m2.mean())
                row[st] = {"sd_across_runs": float(x.std(ddof=1)), "rms_mcse": float(np.sqrt(m2.mean()))}
            rows.append(row)
    df = len(rows) * (S - 1)
    lo_q, hi_q = chi2.ppf([(1 + confidence) / 2, (1 - confidence) / 2], df)
    ratio = {st: {"ratio": float(np.sqrt(var_sum[st] / mcse2_sum[st])),
                  "interval": [float(np.sqrt(var_sum[st] / mcse2_sum[st] * df / lo_q)),
                               float(np.sqrt(var_sum[st] / mcse2_sum[st] * df / hi_q))]}
             for st in dg.STATISTICS}
    return {"runs": S, "degrees_of_freedom": df, "confidence": confidence, "spread_ratio": ratio, "rows": rows}


def lean_beyond_null(rows: Sequence[Mapping], null_rows: Sequence[Mapping]) -> dict:
    """A candidate's shared shift less the registered sampler's against the same references.
    ``rows``: ``compare_runs`` rows of the candidate; ``null_rows``: rows of the registered
    sampler run again at the candidate's length (``power_gpu_blocks.py null``), one or more runs
    per dataset. Per contrast and statistic, over the datasets both scored: the candidate's
    mean z less the null's, in standard errors (each z is about N(0, 1) under a correct sampler,
    so SE = sqrt(1/n + 1/m) for n candidate and m null rows).

    Why: a shared shift can come from the comparison, not the sampler (a reference endpoint's
    own error, a bias of the HDI estimator that the comparison at the candidate's length leaves),
    and the registered sampler, scored against the same references, shows that part too. What
    is left is the candidate's own lean. Not judged by item 3(a)'s rule; reported beside it."""
    common = sorted({int(r["dataset"]) for r in rows} & {int(r["dataset"]) for r in null_rows})
    if not common:
        raise ValueError("lean_beyond_null: the null scored none of the candidate's datasets; run it on them")
    out = {}
    for name in dict.fromkeys(r["contrast"] for r in rows):
        for st in dg.STATISTICS:
            a = [r[f"z_{st}"] for r in rows if r["contrast"] == name and int(r["dataset"]) in common]
            b = [r[f"z_{st}"] for r in null_rows if r["contrast"] == name and int(r["dataset"]) in common]
            if not a or not b:
                raise ValueError(f"lean_beyond_null: contrast {name} is missing from the "
                                 f"{'null' if a else 'candidate'}'s rows")
            out[f"{name}.{st}"] = {"candidate_mean_z": float(np.mean(a)), "null_mean_z": float(np.mean(b)),
                                   "lean_z": float((np.mean(a) - np.mean(b)) / np.sqrt(1 / len(a) + 1 / len(b)))}
    return {"datasets": common, "per_statistic": out,
            "max_abs_lean_z": max(abs(v["lean_z"]) for v in out.values())}


def meets_rule(rule, rhat, ess_bulk, ess_tail, divergences):
    """Whether the registered convergence rule is met (arrays or scalars): only where every figure
    is shown within it, so a NaN (too few draws to estimate) does not meet it, as in
    ``models.fits.convergence_problems``."""
    return ((rhat <= rule.rhat_max) & (ess_bulk >= rule.ess_bulk_min) & (ess_tail >= rule.ess_tail_min)
            & (divergences <= rule.divergences_max))


def convergence_counts(draws: Mapping[str, np.ndarray], rule, divergences: np.ndarray | None = None) -> dict:
    """Per reported contrast, how many datasets miss the registered convergence rule (R-hat,
    bulk and tail ESS on that contrast; divergences of the fit), and the datasets missing it on
    any contrast (to be extended, then counted and kept: D7). ``draws``: contrast -> (K,
    chains, draws), or K arrays (chains, draws) whose lengths may differ (an extended fit)."""
    K = len(next(iter(draws.values())))
    failing = np.zeros(K, dtype=bool)
    out = {}
    div = np.zeros(K) if divergences is None else np.array([np.sum(d) for d in divergences], dtype=float)
    for name, x in draws.items():
        rh = np.array([dg.rhat(x[k]) for k in range(K)])
        eb = np.array([dg.ess_bulk(x[k]) for k in range(K)])
        et = np.array([dg.ess_tail(x[k]) for k in range(K)])
        bad = ~meets_rule(rule, rh, eb, et, div)
        failing |= bad
        out[name] = {"failing": int(bad.sum()), "rhat_max": float(rh.max()), "ess_bulk_min": float(eb.min()),
                     "ess_tail_min": float(et.min())}
    return {"per_contrast": out, "datasets_failing_any": int(failing.sum()), "failing": failing.tolist()}


def sbc(truth: Mapping[str, np.ndarray], posterior: Mapping[str, np.ndarray], thin_to: int = 99,
        bins: int = 10) -> dict:
    """SBC: ``truth`` maps a quantity to its prior draws (N,), ``posterior`` to (N, chains, draws)
    draws of the fits to those draws' simulated data; each thinned to ``thin_to`` draws (evenly
    spaced within each chain, then pooled) before ranking. Per quantity: the uniformity p."""
    out = {}
    for name, t in truth.items():
        x = np.asarray(posterior[name])
        step = max(1, (x.shape[1] * x.shape[2]) // thin_to)
        pooled = x.reshape(x.shape[0], -1)[:, ::step][:, :thin_to]
        ranks = dg.sbc_ranks(np.asarray(t), pooled)
        out[name] = {"p": dg.uniformity_p(ranks, pooled.shape[1], bins), "ranks": ranks.tolist()}
    return {"per_quantity": {k: v["p"] for k, v in out.items()}, "min_p": float(min(v["p"] for v in out.values())),
            "prior_draws": int(len(next(iter(truth.values())))), "ranks": {k: v["ranks"] for k, v in out.items()}}


def verdict(comparison_passed: bool, candidate_failing: int, reference_failing: int, sbc_passed: bool | None) -> dict:
    """The validation's verdict from its parts: ``comparison_passed`` (MCSE units and labels,
    ``compare_runs``), the candidate's datasets missing the convergence rule on any reported
    contrast, the reference runs missing it (their divergences, ESS or R-hat), and the SBC
    (None: not run). "failed" where a part that ran failed (the candidate's comparison, its
    convergence, the SBC); else "incomplete" where a part is missing: no SBC, or a reference
    that misses the rule (the comparison then rests on a biased or wide "truth", and agreeing
    with it proves nothing; refit it longer or with a higher target acceptance); else
    "passed". Returns ``status``, ``passed`` and the ``reasons`` (empty when passed)."""
    failed, missing = [], []
    if not comparison_passed:
        failed.append("the comparison with the reference (MCSE units or labels) fails")
    if candidate_failing:
        failed.append(f"{candidate_failing} candidate dataset(s) miss the convergence rule")
    if sbc_passed is False:
        failed.append("SBC rejects uniformity")
    if sbc_passed is None:
        missing.append("SBC not run")
    if reference_failing:
        missing.append(f"{reference_failing} reference run(s) miss the convergence rule: their comparisons prove nothing")
    status = "failed" if failed else "incomplete" if missing else "passed"
    return {"status": status, "passed": status == "passed", "reasons": failed + missing}


def samplers_differing(names: Sequence[str], samplers: Sequence[Mapping], fields: Sequence[str]) -> list[str]:
    """"name: sampler" of each run whose sampler settings (``fields``) are not the first run's:
    runs scored or vouched for together must be of one sampler. Empty where they are."""
    first = samplers[0] if samplers else {}
    return [f"{n}: {dict(x)}" for n, x in zip(names, samplers) if any(x.get(k) != first.get(k) for k in fields)]


def verdict_across_scenarios(records: Mapping[str, Mapping], scenarios: Sequence[str], datasets_needed: int,
                             sampler_fields: Sequence[str]) -> dict:
    """Item 3(a) at registered size for the registered sampler's change: "on at least 64
    datasets per scenario". ``records`` maps a scenario to its block's scored record (``verdict``,
    ``datasets``, ``sampler``, ``settings_sha256``; ``power_gpu_blocks.py rescore`` writes them);
    ``scenarios``: the registered ones (``settings.power.scenarios``). "passed" only where every
    registered scenario was scored, on at least ``datasets_needed`` datasets, and passed; "failed"
    where a scored scenario failed, whatever else is missing; else "incomplete", naming each
    scenario short of a pass. A pass vouches for one sampler under one set of registered settings,
    so records of other samplers (``sampler_fields``), settings or designs (``frames``, ``depths``),
    or of an unregistered scenario, are an error naming them. Returns ``status``, ``passed``,
    ``reasons``, the common ``sampler``, settings hash and design, and each scenario's figures."""
    unregistered = sorted(set(records) - set(scenarios))
    if unregistered:
        raise ValueError(f"scenario(s) {unregistered} are not registered (power.scenarios: {list(scenarios)})")
    ran = {s: {k: (r.get("sampler") or {}).get(k) for k in sampler_fields} for s, r in records.items()}
    if samplers_differing(list(ran), list(ran.values()), sampler_fields):
        raise ValueError(f"the scenarios were fitted by other samplers ({ran}); fit every scenario with one")
    hashes = {s: r.get("settings_sha256") for s, r in records.items()}
    if len(set(hashes.values())) > 1:
        raise ValueError(f"the scenarios were exported under other registered settings ({hashes}); export and fit "
                         "every scenario under one")
    designs = {s: (r.get("frames"), r.get("depths")) for s, r in records.items()}
    if len(set(designs.values())) > 1:
        raise ValueError(f"the scenarios were simulated at other designs (frames, depths) {designs}; export every "
                         "scenario at one")
    failed, missing, per = [], [], {}
    for s in scenarios:
        r = records.get(s)
        if r is None:
            missing.append(f"{s}: not scored")
            continue
        v, n = r["verdict"], int(r["datasets"])
        per[s] = {"status": v["status"], "datasets": n, "max_z": float(r["max_z"]), "z_bound": float(r["z_bound"]),
                  "label_flips": int(r["label_flips"]), "reasons": list(v["reasons"])}
        if v["status"] == "failed":
            failed.append(f"{s}: " + "; ".join(v["reasons"]))
        elif v["status"] != "passed":
            missing.append(f"{s}: " + "; ".join(v["reasons"]))
        if n < datasets_needed:
            missing.append(f"{s}: {n} of the {datasets_needed} datasets a scenario needs")
    status = "failed" if failed else "incomplete" if missing else "passed"
    sampler = dict(next(iter(records.values())).get("sampler") or {}) if records else {}
    frames, depths = next(iter(designs.values()), (None, None))
    return {"status": status, "passed": status == "passed", "reasons": failed + missing, "sampler": sampler,
            "settings_sha256": next(iter(hashes.values()), None), "frames": frames, "depths": depths,
            "scenarios": per}
