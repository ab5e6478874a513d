"""Rank-normalised split R-hat and bulk/tail ESS (Vehtari et al. 2021, the estimators ArviZ
uses for 4.7's convergence rule) in NumPy and SciPy only, for the machines that run the
vectorised sampler without ArviZ (``benchmarks/power_gpu.py``). ``x``: (chains, draws) of one
scalar quantity. Checked against ArviZ in ``fear_assets_tests/test_power_gpu_export.py``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri


def _split(x: np.ndarray) -> np.ndarray:
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, -half:]], axis=0)


def _z_scale(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata  # here: loading the definitions stays free of scipy.stats

    r = rankdata(x, method="average").reshape(x.shape)
    return ndtri((r - 3 / 8) / (x.size - 2 * 3 / 8 + 1))


def _ess(x: np.ndarray) -> float:
    """Geyer's initial monotone sequence on the chains' FFT autocovariances (ArviZ's ``_ess``)."""
    x = np.asarray(x, dtype=float)
    if np.max(x) - np.min(x) < np.finfo(float).resolution:
        return float(x.size)
    chains, n = x.shape
    m = 1 << int(np.ceil(np.log2(2 * n)))
    c = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(c, n=m, axis=1)
    acov = np.fft.irfft(f * np.conjugate(f), n=m, axis=1)[:, :n] / n
    mean_var = acov[:, 0].mean() * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus += np.var(x.mean(axis=1), ddof=1)
    rho = np.zeros(n)
    even, odd = 1.0, 1.0 - (mean_var - acov[:, 1].mean()) / var_plus
    rho[0], rho[1] = even, odd
    t = 1
    while t < n - 3 and even + odd > 0.0:
        even = 1.0 - (mean_var - acov[:, t + 1].mean()) / var_plus
        odd = 1.0 - (mean_var - acov[:, t + 2].mean()) / var_plus
        if even + odd >= 0:
            rho[t + 1], rho[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0:
        rho[max_t + 1] = even
    t = 1
    while t <= max_t - 2:
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = (rho[t - 1] + rho[t]) / 2.0
        t += 2
    tau = -1.0 + 2.0 * rho[:max_t + 1].sum() + rho[max_t + 1:max_t + 2].sum()
    tau = max(tau, 1 / np.log10(chains * n))
    return float(chains * n / tau)


def _too_short(x: np.ndarray, min_chains: int = 1) -> bool:
    """ArviZ's shape rule: fewer than 4 draws per chain (or ``min_chains`` chains) estimate
    nothing, so the estimate is NaN, which no convergence rule passes."""
    return x.shape[1] < 4 or x.shape[0] < min_chains


def ess_bulk(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    if _too_short(x):
        return float("nan")
    return _ess(_z_scale(_split(x)))


def ess_tail(x: np.ndarray) -> float:
    """min of the 5% and 95% quantile-indicator ESS."""
    x = np.asarray(x, dtype=float)
    if _too_short(x):
        return float("nan")
    return min(_ess(_split((x <= np.quantile(x, p)).astype(float))) for p in (0.05, 0.95))


def _rhat(x: np.ndarray) -> float:
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1))
    return float(np.sqrt((between / within + n - 1) / n))


def rhat(x: np.ndarray) -> float:
    """Rank-normalised split R-hat: the larger of the bulk and folded (tail) values."""
    x = np.asarray(x, dtype=float)
    if _too_short(x, min_chains=2):
        return float("nan")
    s = _split(x)
    return max(_rhat(_z_scale(s)), _rhat(_z_scale(np.abs(s - np.median(s)))))


def hdi(x: np.ndarray, prob: float) -> tuple[float, float]:
    """Highest-density interval of pooled draws: the narrowest interval holding
    ``floor(prob * n)`` of the ``n`` sorted draws (ArviZ's ``hdi`` for a unimodal sample)."""
    flat = np.asarray(x, dtype=float).reshape(1, -1)
    n = flat.shape[1]
    if not 0 < int(np.floor(prob * n)) < n:
        raise ValueError(f"an HDI of mass {prob} needs more than {n} draws")
    low, high = _hdi_rows(flat, prob)
    return float(low[0]), float(high[0])


# -- Monte Carlo standard errors (ArviZ's estimators) and the validation's comparisons ----------
def mcse_mean(x: np.ndarray) -> float:
    """MCSE of the posterior mean: sd / sqrt(bulk ESS of the raw draws), as ArviZ's ``mcse``."""
    x = np.asarray(x, dtype=float)
    return float(np.std(x, ddof=1) / np.sqrt(_ess(_split(x))))


def mcse_sd(x: np.ndarray) -> float:
    """MCSE of the posterior SD (ArviZ's ``_mcse_sd``): the squared deviations' ESS and
    variance, by the delta method."""
    x = np.asarray(x, dtype=float)
    c2 = (x - x.mean()) ** 2
    ess = _ess(_split(c2))
    evar = c2.mean()
    return float(np.sqrt(((c2 ** 2).mean() - evar ** 2) / ess / evar / 4))


def mcse_quantile(x: np.ndarray, prob: float) -> float:
    """MCSE of the ``prob`` quantile (ArviZ's ``_mcse_quantile``): the quantile indicator's ESS,
    then half the distance between the draws at the Beta interval's +-1 sd probabilities."""
    from scipy.stats import beta as beta_dist

    x = np.asarray(x, dtype=float)
    ess = _ess(_split((x <= np.quantile(x, prob)).astype(float)))
    with np.errstate(invalid="ignore"):
        ppf = beta_dist.ppf([0.1586553, 0.8413447], ess * prob + 1, ess * (1 - prob) + 1) * x.size - 1
    s = np.sort(x.reshape(-1))
    return float((s[int(np.ceil(np.nanmin((ppf[1], x.size - 1))))] - s[int(np.floor(np.nanmax((ppf[0], 0))))]) / 2)


def _hdi_rows(x: np.ndarray, prob: float) -> tuple[np.ndarray, np.ndarray]:
    """``hdi`` of every row of ``x`` (replicates, n): only the ``n - k`` smallest and largest
    draws can be an endpoint, so two partitions replace a full sort."""
    n = x.shape[1]
    k = int(np.floor(prob * n))
    m = n - k
    if 2 * m >= n:
        s = np.sort(x, axis=1)
        lows, highs = s[:, :m], s[:, k:]
    else:
        p = np.partition(x, (m - 1, n - m), axis=1)
        lows, highs = np.sort(p[:, :m], axis=1), np.sort(p[:, n - m:], axis=1)
    i = np.argmin(highs - lows, axis=1)
    r = np.arange(len(x))
    return lows[r, i], highs[r, i]


def mcse_hdi(x: np.ndarray, prob: float, rng: np.random.Generator, replicates: int = 400) -> tuple[float, float]:
    """MCSE of the ``prob`` HDI's two endpoints of (chains, draws) draws: their SD over a
    moving-block bootstrap within each chain (blocks of twice the draws' integrated
    autocorrelation time, ``draws / ESS``; ``replicates`` resamples drawn from ``rng``).

    Why not a quantile's MCSE at the endpoint's share (the estimator before 2026-12-05): an HDI
    endpoint is the end of the NARROWEST interval, so the share below it moves from sample to
    sample too, and that movement shifts the endpoint at first order. A quantile's MCSE leaves it
    out: with two independent runs of the same distribution (AR(1) draws, 4 x 500 against 4 x
    4,000) its z-scores had an SD up to 1.5 and |z| > 3 in up to 6% of pairs instead of 0.3%; the
    bootstrap recomputes the whole HDI and gave 0.95-1.12 where the draws' ESS meets the
    convergence rule (``benchmarks/hdi_mcse_null.py``)."""
    x = np.asarray(x, dtype=float)
    chains, n = x.shape
    tau = x.size / _ess(_split(x))
    block = int(min(n, max(1, np.ceil(2 * tau))))
    per_chain = int(np.ceil(n / block))
    starts = rng.integers(0, n - block + 1, size=(replicates, chains, per_chain))
    idx = (starts[..., None] + np.arange(block)).reshape(replicates, chains, -1)[:, :, :n]
    resampled = np.take_along_axis(np.broadcast_to(x, (replicates, chains, n)), idx, axis=2)
    lows, highs = _hdi_rows(resampled.reshape(replicates, -1), prob)
    return float(lows.std(ddof=1)), float(highs.std(ddof=1))


def hdi_at_length(x: np.ndarray, prob: float, draws: int, rng: np.random.Generator) -> dict:
    """The ``prob`` HDI endpoints that a run of ``draws`` draws per chain gives on average, from a
    longer run ``x`` (chains, N): the mean over its ``N // draws`` disjoint stretches of that
    length, with MCSE sqrt(mean of the stretches' ``mcse_hdi`` variances / stretches).

    Why: the narrowest interval holding 99% of n draws is on average narrower than the true
    HDI, the more so the fewer the draws (it is chosen as the narrowest of many). Against a
    long run's own endpoints, a correct run of fewer draws comes out inside: on two correct
    runs (4 x 500 against 4 x 4,000 draws) the lower endpoint's z-scores had a mean of +0.2 to
    +0.8 and the upper's -0.1 to -0.4, which the validation's bound would read as bias in the
    sampler. Compared at one length, the HDI's own bias cancels."""
    x = np.asarray(x, dtype=float)
    n = int(min(max(1, draws), x.shape[1]))
    stretches = x.shape[1] // n
    ends = np.array([hdi(x[:, s * n:(s + 1) * n], prob) for s in range(stretches)])
    errors = np.array([mcse_hdi(x[:, s * n:(s + 1) * n], prob, rng) for s in range(stretches)])
    low, high = ends.mean(axis=0)
    mcse_low, mcse_high = np.sqrt((errors ** 2).mean(axis=0) / stretches)
    return {"hdi_low": float(low), "hdi_high": float(high), "mcse_hdi_low": float(mcse_low),
            "mcse_hdi_high": float(mcse_high), "stretches": stretches}


def summary_with_mcse(x: np.ndarray, prob: float, rng: np.random.Generator) -> dict:
    """Posterior mean, SD and ``prob`` HDI endpoints of (chains, draws) draws, each with its
    MCSE (the endpoints' by ``mcse_hdi``'s bootstrap, drawn from ``rng``)."""
    x = np.asarray(x, dtype=float)
    low, high = hdi(x, prob)
    flat = x.reshape(-1)
    mcse_low, mcse_high = mcse_hdi(x, prob, rng)
    return {"mean": float(flat.mean()), "sd": float(flat.std(ddof=1)), "hdi_low": low, "hdi_high": high,
            "mcse_mean": mcse_mean(x), "mcse_sd": mcse_sd(x), "mcse_hdi_low": mcse_low, "mcse_hdi_high": mcse_high}


STATISTICS = ("mean", "sd", "hdi_low", "hdi_high")


def z_scores(a: dict, b: dict) -> dict:
    """Per statistic, the difference of two runs' estimates in MCSE units (both runs' MCSE):
    (a - b) / sqrt(mcse_a^2 + mcse_b^2). ``a``, ``b``: ``summary_with_mcse`` results."""
    return {k: float((a[k] - b[k]) / np.sqrt(a[f"mcse_{k}"] ** 2 + b[f"mcse_{k}"] ** 2)) for k in STATISTICS}


def near_boundary(s: dict, boundaries, k: float = 2.0) -> bool:
    """Whether an HDI endpoint lies within ``k`` MCSE of a decision boundary (0, +-ROPE):
    there a label may differ between two correct runs."""
    return any(abs(s[e] - c) <= k * s[f"mcse_{e}"] for e in ("hdi_low", "hdi_high") for c in boundaries)


def sbc_ranks(truth: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Simulation-based calibration ranks: per prior draw i, how many of its posterior draws
    (``draws[i]``, thinned to near-independence) fall below the true value ``truth[i]``."""
    return (np.asarray(draws) < np.asarray(truth)[:, None]).sum(axis=1)


def uniformity_p(ranks: np.ndarray, n_draws: int, bins: int = 10) -> float:
    """Chi-square test that SBC ranks (0..n_draws) are uniform, over ``bins`` equal bins."""
    from scipy.stats import chisquare

    edges = np.linspace(0, n_draws + 1, bins + 1)
    counts, _ = np.histogram(np.asarray(ranks) + 0.5, bins=edges)
    return float(chisquare(counts).pvalue)
