"""The residual-stream probe and its controls, as registered (protocol 4.5, 6.1, 6.3).

For each frame, three-fold cross-validation over the three name rotations: hold out one
rotation, train on the other two (all six cells, all depths, both content versions: 384
documents per fold for a registered family). Features are residualised on every
order x depth x cell combination with means estimated on the training fold only and
applied unchanged to the held-out fold; the probe is an L2 logistic regression (C = 1.0)
on standardised features. Controls on the held-out fold: cell+order+depth only,
order+depth only, depth only, shuffled training labels, and documents without the agent
sentence; each reports held-out accuracy with a 99% interval, and any interval excluding
0.5 makes H4 uninterpretable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from fear_assets.core.hashing import derived_seed

if TYPE_CHECKING:
    from sklearn.preprocessing import OneHotEncoder

RESIDUAL_KEYS = ["order", "depth_index", "condition_code"]
CONTROLS = {
    "cell_order_depth": ["condition_code", "order", "depth_index"],
    "order_depth": ["order", "depth_index"],
    "depth": ["depth_index"],
}
OUTPUT_COLUMNS = ["trial_id", "item_id", "fold_rotation", "order", "depth_index", "condition_code",
                  "content_option", "p_correct", "log_odds", "correct"]


@dataclass(frozen=True)
class ProbeSettings:
    inverse_regularisation: float
    clip: tuple[float, float]
    interval: float
    master_seed: int

    @classmethod
    def from_settings(cls, settings) -> "ProbeSettings":
        probe = settings.probe
        return cls(probe.inverse_regularisation, probe.clip, probe.control_interval, settings.master_seed)


# ---------------------------------------------------------------------------------------
# Residualisation: fitted on the training fold only
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Residualiser:
    keys: tuple[str, ...]
    means: dict[tuple, np.ndarray]
    fallback: np.ndarray
    fitted_trials: frozenset = frozenset()  # which documents the means came from (audit)

    @classmethod
    def fit(cls, X: np.ndarray, meta: pd.DataFrame, keys: Sequence[str] = RESIDUAL_KEYS) -> "Residualiser":
        groups = meta[list(keys)].itertuples(index=False, name=None)
        index: dict[tuple, list[int]] = {}
        for i, g in enumerate(groups):
            index.setdefault(g, []).append(i)
        means = {g: X[rows].mean(axis=0) for g, rows in index.items()}
        return cls(tuple(keys), means, X.mean(axis=0), frozenset(meta["trial_id"]))

    def transform(self, X: np.ndarray, meta: pd.DataFrame) -> np.ndarray:
        """Subtract each row's training-fold combination mean (never re-estimated here)."""
        groups = list(meta[list(self.keys)].itertuples(index=False, name=None))
        return X - np.stack([self.means.get(g, self.fallback) for g in groups])

    def marginal(self, keys: Sequence[str]) -> "Residualiser":
        """Means over a subset of the keys (for documents without a cell: no agent sentence)."""
        pos = [self.keys.index(k) for k in keys]
        pooled: dict[tuple, list[np.ndarray]] = {}
        for g, m in self.means.items():
            pooled.setdefault(tuple(g[p] for p in pos), []).append(m)
        return Residualiser(tuple(keys), {g: np.mean(v, axis=0) for g, v in pooled.items()}, self.fallback,
                            self.fitted_trials)


# scikit-learn and statsmodels are imported where they are used: the Dagster definitions import
# this module, and every run and step process would otherwise load them.
def _probe(c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))


def _design(meta: pd.DataFrame, columns: Sequence[str], encoder: OneHotEncoder | None = None):
    from sklearn.preprocessing import OneHotEncoder

    values = meta[list(columns)].astype(str).to_numpy()
    if encoder is None:
        encoder = OneHotEncoder(handle_unknown="ignore").fit(values)
    return encoder.transform(values).toarray(), encoder


def balanced_shuffle(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Shuffled labels that carry no information about the true ones: within each true
    class, half the documents get each label. A plain permutation correlates with the true
    labels by chance in a small fold, and a strong feature turns that into accuracy far
    from 0.5 (seen on constructed data), which would fake a failed control."""
    out = np.empty_like(y)
    labels = np.unique(y)
    for value in labels:
        idx = rng.permutation(np.flatnonzero(y == value))
        out[idx] = np.resize(labels, len(idx))[rng.permutation(len(idx))]
    return out


def run_fold(X: np.ndarray, meta: pd.DataFrame, held_out: int, config: ProbeSettings,
             no_agent_X: np.ndarray | None = None, no_agent_meta: pd.DataFrame | None = None) -> dict:
    """One fold of one frame: train on the other rotations, evaluate on ``held_out``."""
    from sklearn.linear_model import LogisticRegression

    train = (meta["rotation"] != held_out).to_numpy()
    test = ~train
    y = meta["content_option"].to_numpy()
    res = Residualiser.fit(X[train], meta[train])
    Xtr, Xte = res.transform(X[train], meta[train]), res.transform(X[test], meta[test])
    probe = _probe(config.inverse_regularisation).fit(Xtr, y[train])
    classes = list(probe.classes_)
    proba = probe.predict_proba(Xte)
    p_correct = proba[np.arange(len(Xte)), [classes.index(v) for v in y[test]]]
    lo, hi = config.clip
    p_correct = np.clip(p_correct, lo, hi)
    out = meta.loc[test, ["trial_id", "item_id", "order", "depth_index", "condition_code", "content_option"]].copy()
    out.insert(2, "fold_rotation", held_out)
    out["p_correct"] = p_correct
    out["log_odds"] = np.log(p_correct / (1 - p_correct))
    out["correct"] = probe.predict(Xte) == y[test]
    controls: dict[str, tuple[int, int]] = {}
    for name, cols in CONTROLS.items():
        Dtr, enc = _design(meta[train], cols)
        Dte, _ = _design(meta[test], cols, enc)
        model = LogisticRegression(C=config.inverse_regularisation, max_iter=5000).fit(Dtr, y[train])
        controls[name] = (int((model.predict(Dte) == y[test]).sum()), int(test.sum()))
    rng = np.random.default_rng(derived_seed(config.master_seed, "probe-shuffle", meta["item_id"].iloc[0], held_out))
    shuffled = _probe(config.inverse_regularisation).fit(Xtr, balanced_shuffle(y[train], rng))
    controls["shuffled_labels"] = (int((shuffled.predict(Xte) == y[test]).sum()), int(test.sum()))
    if no_agent_X is not None and no_agent_meta is not None and len(no_agent_meta):
        na = (no_agent_meta["rotation"] == held_out).to_numpy()
        if na.any():
            marginal = res.marginal(["order", "depth_index"])
            Xna = marginal.transform(no_agent_X[na], no_agent_meta[na])
            pred = probe.predict(Xna)
            labels = no_agent_meta.loc[na, "content_option"].to_numpy()
            controls["no_agent_sentence"] = (int((pred == labels).sum()), int(na.sum()))
    return {"outputs": out, "controls": controls, "residualised_on": res.fitted_trials}


def interval(successes: int, n: int, level: float) -> tuple[float, float]:
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(successes, n, alpha=1 - level, method="beta")
    return float(lo), float(hi)


def run_probes(X: np.ndarray, meta: pd.DataFrame, config: ProbeSettings, no_agent_X: np.ndarray | None = None,
               no_agent_meta: pd.DataFrame | None = None, n_jobs: int = -1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All frames' folds, in parallel across cores. Returns (per-document outputs, controls).

    ``meta`` rows align with ``X`` rows and carry trial_id, item_id, rotation, order,
    depth_index, condition_code and content_option (the option shown, the label)."""
    jobs = []
    for item in sorted(meta["item_id"].unique()):
        rows = (meta["item_id"] == item).to_numpy()
        m = meta[rows].reset_index(drop=True)
        na_rows = (no_agent_meta["item_id"] == item).to_numpy() if no_agent_meta is not None else None
        if m["rotation"].nunique() < 2:
            raise ValueError(f"probes: frame {item} has documents at rotation {', '.join(map(str, m['rotation'].unique()))} "
                             "only; each fold trains on the other rotations and reads the held-out one (4.5), so a "
                             "frame needs two rotations or more. Fix: keep two rotations in the design "
                             "(reduced_design.rotations_by_depth)")
        for held_out in sorted(m["rotation"].unique()):
            jobs.append(delayed(run_fold)(
                X[rows], m, int(held_out), config,
                no_agent_X[na_rows] if na_rows is not None else None,
                no_agent_meta[na_rows].reset_index(drop=True) if na_rows is not None else None))
    results = Parallel(n_jobs=n_jobs)(jobs)
    outputs = pd.concat([r["outputs"] for r in results], ignore_index=True)[OUTPUT_COLUMNS]
    totals: dict[str, list[int]] = {}
    for r in results:
        for name, (k, n) in r["controls"].items():
            t = totals.setdefault(name, [0, 0])
            t[0] += k
            t[1] += n
    rows = []
    for name, (k, n) in [("probe", (int(outputs["correct"].sum()), len(outputs))), *totals.items()]:
        lo, hi = interval(k, n, config.interval)
        rows.append({"probe": name, "correct": k, "n": n, "accuracy": k / n if n else float("nan"),
                     "interval_low": lo, "interval_high": hi,
                     "excludes_chance": bool(lo > 0.5 or hi < 0.5)})
    return outputs.sort_values(["item_id", "trial_id"], ignore_index=True), pd.DataFrame(rows)


def h4_interpretable(controls: pd.DataFrame) -> bool:
    """6.1: H4 is uninterpretable if any control probe's interval excludes 0.5."""
    return not bool(controls.loc[controls["probe"] != "probe", "excludes_chance"].any())


def pilot_rules(outputs: pd.DataFrame, shallowest: int, band: Sequence[int], ceiling: float,
                level: float) -> dict:
    """6.3: decoding at the shallowest depth; mean accuracy at the band depths; ceiling rule."""
    shallow = outputs[outputs["depth_index"] == shallowest]
    k, n = int(shallow["correct"].sum()), len(shallow)
    lo, hi = interval(k, n, level) if n else (float("nan"), float("nan"))
    at_band = outputs[outputs["depth_index"].isin(list(band))]
    band_acc = float(at_band.groupby("depth_index")["correct"].mean().mean()) if len(at_band) else float("nan")
    return {"shallowest_depth": shallowest, "shallowest_accuracy": k / n if n else float("nan"),
            "shallowest_interval": (lo, hi), "decodes_at_shallowest": bool(n and lo > 0.5),
            "band_depths": list(band), "band_mean_accuracy": band_acc,
            "ceiling": bool(band_acc > ceiling), "h4_estimation_only": bool(band_acc > ceiling)}
