"""The gate and pilot figures of the researcher's view (issue 15), as PNG bytes.

The forest plot and Delta by depth live in ``fear_assets.analysis.plots`` (one place per
plot); this module adds the pilot gates' figures: probe accuracy by depth with its
controls (6.1), matching differences per frame against the tolerance (4.3), binding pass
rates (4.2), the power simulation's label frequencies (6.3) and the name gate as a table
(4.2). Every function is pure: plain tables in, PNG bytes (or Markdown) out, drawn off
screen by the Agg backend. ``markdown_image`` turns the bytes into the Markdown form the
Dagster UI renders (it has no image metadata type).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fear_assets.analysis.estimands import NOT_CONVERGED_TEXT
from fear_assets.analysis.plots import COLOURS, NOT_CONVERGED_COLOUR, _figure, _png, markdown_image

__all__ = ["probe_accuracy_plot", "matching_plot", "binding_plot", "label_frequency_plot", "name_gate_table", "name_gate_plot",
           "markdown_image"]

PASS, FAIL = "#1b7837", "#b2182b"


def _require(table: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}; it needs {columns} (the stored asset's table)")


def _nothing(message: str) -> bytes:
    """A figure that says there is nothing to draw (an empty stored table), so an asset's
    metadata never fails on a design that has no rows for a figure."""
    fig, ax = _figure(6.0, 1.2)
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center")
    return _png(fig)


def probe_accuracy_plot(probe_outputs: pd.DataFrame, probe_controls: pd.DataFrame) -> bytes:
    """Probe accuracy by depth (6.1), one line per frame set, with the control probes'
    accuracies and intervals beside it and chance (0.5) marked: H4 is read only when every
    control decodes at chance."""
    _require(probe_outputs, ["frame_set", "depth_index", "correct"], "probe_outputs")
    _require(probe_controls, ["frame_set", "probe", "accuracy", "interval_low", "interval_high"], "probe_controls")
    if probe_outputs.empty:
        return _nothing("no probe outputs stored for this family")
    fig = _figure(9.0, 3.8)[0]
    fig.clear()
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2], "wspace": 0.75})
    for frame_set, part in probe_outputs.groupby("frame_set"):
        by = part.groupby("depth_index")["correct"].agg(["mean", "size"]).reset_index()
        se = np.sqrt(by["mean"] * (1 - by["mean"]) / by["size"].clip(lower=1))
        left.errorbar(by["depth_index"], by["mean"], yerr=1.96 * se, marker="o", capsize=3, label=f"{frame_set} probe")
    left.axhline(0.5, color="black", linestyle=":", linewidth=1, label="chance")
    depths = sorted(probe_outputs["depth_index"].unique())
    left.set_xticks(depths, [f"d{int(d)}" for d in depths])
    left.set_xlabel("depth (d1 = shallowest)")
    left.set_ylabel("held-out accuracy (proportion correct)")
    left.set_ylim(-0.02, 1.02)
    left.legend(fontsize="small", frameon=False)
    controls = probe_controls.reset_index(drop=True)
    y = np.arange(len(controls))[::-1]
    for yi, row in zip(y, controls.itertuples(index=False)):
        at_chance = row.interval_low <= 0.5 <= row.interval_high
        colour = "#333333" if row.probe == "probe" else (PASS if at_chance else FAIL)
        right.hlines(yi, row.interval_low, row.interval_high, color=colour, linewidth=2)
        right.plot(row.accuracy, yi, "o", color=colour)
    right.axvline(0.5, color="black", linestyle=":", linewidth=1)
    right.set_yticks(y, [f"{r.frame_set}: {r.probe}" for r in controls.itertuples(index=False)], fontsize="small")
    right.set_xlabel("accuracy with interval (controls: green = at chance)")
    right.set_xlim(-0.02, 1.02)
    return _png(fig)


def matching_plot(matched_frames: pd.DataFrame, tolerance: float) -> bytes:
    """Each frame's largest absolute surprisal difference between cells (nats) against the
    registered tolerance (4.3); bars past the line fail matching and name the frames to
    replace."""
    _require(matched_frames, ["item_id", "max_abs_difference", "passes"], "matched_frames")
    if not np.isfinite(tolerance) or tolerance <= 0:
        raise ValueError(f"tolerance must be a positive number (settings: matching.max_abs_difference), got {tolerance}")
    if matched_frames.empty:
        return _nothing("no frames examined")
    table = matched_frames.sort_values("max_abs_difference").reset_index(drop=True)
    fig, ax = _figure(7.0, 0.9 + 0.28 * len(table))
    colours = [PASS if bool(p) else FAIL for p in table["passes"]]
    ax.barh(table["item_id"], table["max_abs_difference"], color=colours)
    ax.axvline(tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance {tolerance:g} nats")
    ax.set_xlabel("largest |surprisal difference| between cells (nats); green passes, red fails")
    ax.set_ylabel("frame")
    ax.legend(fontsize="small", frameon=False)
    return _png(fig)


def binding_plot(binding_results: pd.DataFrame, required_rate: float) -> bytes:
    """Binding checks (4.2): each frame's share of single-sentence checks answered
    correctly (a frame passes only with all of them) and the in-context rate against the
    registered rate."""
    _require(binding_results, ["item_id", "n_checks", "n_correct", "passes"], "binding_results")
    if binding_results.empty:
        return _nothing("no binding checks stored")
    table = binding_results.assign(rate=binding_results["n_correct"] / binding_results["n_checks"].clip(lower=1))
    rows = [(str(r.item_id), float(r.rate), bool(r.passes)) for r in table.itertuples(index=False)]
    if "in_context_rate" in table.columns and table["in_context_rate"].notna().any():
        rate = float(table["in_context_rate"].dropna().iloc[0])
        rows.append(("in-context documents", rate, rate >= required_rate))
    fig, ax = _figure(7.0, 0.9 + 0.28 * len(rows))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=[PASS if r[2] else FAIL for r in rows])
    ax.axvline(required_rate, color="black", linestyle="--", linewidth=1,
               label=f"in-context rate required {required_rate:.0%}")
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("binding checks answered correctly (proportion); green passes, red fails")
    ax.legend(fontsize="small", frameon=False, loc="lower right")
    return _png(fig)


def label_frequency_plot(labels: pd.DataFrame) -> bytes:
    """The power simulation's label frequencies (6.3): per contrast, the share of
    simulated datasets that fell in each label; fits that missed the convergence rule are
    their own grey bar, never counted as a label."""
    _require(labels, ["contrast", "label"], "power simulation labels")
    if labels.empty:
        return _nothing("no simulated datasets in this batch")
    table = labels.copy()
    if "converged" in table.columns:
        table.loc[~table["converged"].fillna(False).astype(bool), "label"] = NOT_CONVERGED_TEXT
    counts = table.groupby(["contrast", "label"]).size().unstack(fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    fig, ax = _figure(7.5, 0.9 + 0.4 * len(shares))
    left = np.zeros(len(shares))
    for lab in shares.columns:
        colour = NOT_CONVERGED_COLOUR if lab == NOT_CONVERGED_TEXT else COLOURS.get(lab, "#8c6d31")
        ax.barh(shares.index, shares[lab], left=left, color=colour, label=str(lab).replace("_", " "),
                hatch="///" if lab == NOT_CONVERGED_TEXT else None)
        left += shares[lab].to_numpy()
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of simulated datasets ({int(counts.sum(axis=1).max())} per contrast)")
    ax.legend(fontsize="small", frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return _png(fig)


def name_gate_table(name_gate: pd.DataFrame, names: list[str] | None = None) -> pd.DataFrame:
    """The name gate (4.2) as names x (tokenizer, form): the token count, marked where a
    name splits, so a failed gate shows which tokenizer splits which name in which form."""
    _require(name_gate, ["name", "tokenizer", "form", "n_tokens"], "name_gate")
    pivot = name_gate.pivot_table(index="name", columns=["tokenizer", "form"], values="n_tokens", aggfunc="max")
    if names:
        pivot = pivot.reindex([n for n in names if n in pivot.index])
    return pivot.apply(lambda col: col.map(lambda n: "" if pd.isna(n) else (f"{int(n)}" if n == 1 else f"{int(n)} SPLIT")))


def name_gate_plot(name_gate: pd.DataFrame, names: list[str] | None = None) -> bytes:
    """The name gate (4.2) as a grid, names x (tokenizer, form): each cell is the name's
    token count, green where it is one token, red where the tokenizer splits it."""
    counts = name_gate.pipe(lambda t: (_require(t, ["name", "tokenizer", "form", "n_tokens"], "name_gate"), t)[1]) \
        .pivot_table(index="name", columns=["tokenizer", "form"], values="n_tokens", aggfunc="max")
    if names:
        counts = counts.reindex([n for n in names if n in counts.index])
    if counts.empty:
        return _nothing("no names checked")
    values = counts.to_numpy(dtype=float)
    fig, ax = _figure(1.6 + 0.75 * values.shape[1], 1.2 + 0.32 * values.shape[0])
    colours = np.where(np.isnan(values)[..., None], [1.0, 1.0, 1.0],
                       np.where((values == 1)[..., None], [0.65, 0.85, 0.65], [0.95, 0.6, 0.6]))
    ax.imshow(colours, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize="small")
    ax.set_xticks(range(values.shape[1]), [f"{t}\n{f}" for t, f in counts.columns], fontsize="x-small", rotation=90)
    ax.set_yticks(range(values.shape[0]), counts.index, fontsize="small")
    ax.set_xlabel("tokenizer and name form (cell: tokens; green = one token, red = split)")
    ax.set_ylabel("candidate name")
    return _png(fig)
