"""PNG figures for Dagster asset metadata (``dg.MetadataValue.md(markdown_image(...))``).

Figures are returned as bytes so an asset can hash them, store them or inline them;
nothing here touches the display or pyplot's global state: figures are plain
``matplotlib.figure.Figure`` objects rendered by the Agg backend off-screen, so the same
code runs on a headless, multi-threaded worker without ``matplotlib.use``. HDIs come from
ArviZ, the same function the decision rule's callers use, so the drawn interval is the
labelled one.
"""

from __future__ import annotations

import base64
import io
import math
from typing import TYPE_CHECKING, Mapping

import numpy as np
import pandas as pd

from fear_assets.analysis.estimands import NOT_CONVERGED_TEXT, label_as_read  # noqa: F401 - NOT_CONVERGED_TEXT re-exported
from fear_assets.models.decision import label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_COLUMNS = ("mean", "hdi_low", "hdi_high", "label")
DEPTH_COLUMNS = ("agent", "content", "depth_tokens", "mean", "low", "high")
# Display only: the scale each contrast is on (DECISIONS 3: "on each hypothesis' own scale").
SCALES = {"H1": "Δ", "H2": "Δ", "H3": "Δ", "H4": "probe log-odds", "H5": "d′",
          "gate_a": "Δ", "gate_b": "Δ", "gate_c": "standardised"}
COLOURS = {"supported": "#1b7837", "practically_equivalent": "#2166ac", "contrary": "#b2182b",
           "unresolved": "#6f6f6f"}
#: A label whose fit missed the convergence rule (6.1) is drawn in its own grey, hatched and
#: captioned so; never in a label's colour, least of all that of "supported".
NOT_CONVERGED_COLOUR = "#a6a6a6"


def row_style(label: str, converged: bool, note: str = "") -> tuple[str, str]:
    """(colour, caption) of one forest row: a non-converged fit is never drawn as its label;
    the caption is the row's label as read, the same words the estimands tables show."""
    caption = label_as_read({"status": "estimated", "label": label, "converged": converged, "note": note})
    if not converged:
        return NOT_CONVERGED_COLOUR, caption
    return COLOURS.get(label, "#333333"), caption


def forest_row_labels(table: pd.DataFrame) -> list[str]:
    """The forest plot's y-axis labels, top row first: contrast, its scale and its label as
    read (a row without a label and converged gets no caption)."""
    names = []
    for r in table.itertuples(index=False):
        name = f"{r.contrast} ({r.scale})" if r.scale else r.contrast
        caption = row_style(r.label, r.converged)[1] if (r.label or not r.converged) else ""
        names.append(f"{name}: {caption}" if caption else name)
    return names


def _blank_figure(width: float, height: float) -> Figure:
    # matplotlib is imported when a figure is drawn: the Dagster definitions import this module,
    # and every run and step process would otherwise load it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _figure(width: float, height: float):
    fig = _blank_figure(width, height)
    return fig, fig.add_subplot()


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def _check_rope(rope: tuple[float, float], name: str = "rope") -> tuple[float, float]:
    try:
        low, high = (float(x) for x in rope)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be (low, high), got {rope!r}; pass the registered [-0.15, 0.15]") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"{name} must be (low, high) with low < high, got {rope!r}; pass the registered "
                         "[-0.15, 0.15]")
    return low, high


def contrast_table(contrasts: Mapping[str, np.ndarray] | pd.DataFrame, rope: tuple[float, float],
                   hdi_prob: float, ropes: Mapping[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """Normalise the forest plot's input to rows contrast, mean, hdi_low, hdi_high, label,
    scale, rope_low, rope_high. Each row's ROPE is ``rope`` unless ``ropes`` (or the
    table's own rope_low/rope_high columns) names another: gate (c) has its ROPE on the
    standardised scale (0.15/sigma, protocol 6.2). Draws are summarised with ``az.hdi``;
    their label uses the registered rule when the row's ROPE is symmetric (SESOI = its
    half-width), else it is left blank."""
    import arviz as az

    if not 0.0 < hdi_prob < 1.0:
        raise ValueError(f"hdi_prob must lie in (0, 1), got {hdi_prob}; pass the registered 0.99")
    default = _check_rope(rope)
    ropes = {str(k): _check_rope(v, f"ropes[{k!r}]") for k, v in (ropes or {}).items()}
    if isinstance(contrasts, pd.DataFrame):
        table = contrasts.copy()
        if "contrast" not in table.columns:
            table = table.rename_axis("contrast").reset_index()
        missing = [c for c in TABLE_COLUMNS if c not in table.columns]
        if missing:
            raise ValueError(f"contrast table lacks column(s) {missing}; it needs contrast (or the index), "
                             f"{', '.join(TABLE_COLUMNS)} and optionally scale, rope_low, rope_high")
        table["contrast"] = table["contrast"].astype(str)
        if {"rope_low", "rope_high"} <= set(table.columns):
            given = {c: _check_rope((lo, hi), f"rope of {c!r}")
                     for c, lo, hi in zip(table["contrast"], table["rope_low"], table["rope_high"])}
            ropes = {**given, **ropes}
    else:
        if not isinstance(contrasts, Mapping):
            raise TypeError(f"contrasts must be a mapping name -> draws or a DataFrame, got {type(contrasts).__name__}")
        rows = []
        for name, draws in contrasts.items():
            x = np.asarray(draws, dtype=float).ravel()
            if x.size < 2 or not np.isfinite(x).all():
                raise ValueError(f"contrast {name!r}: need at least 2 finite draws, got {x.size} "
                                 f"({int((~np.isfinite(x)).sum())} non-finite)")
            low, high = (float(v) for v in az.hdi(x, hdi_prob=hdi_prob))
            r_low, r_high = ropes.get(str(name), default)
            symmetric = math.isclose(-r_low, r_high)
            rows.append({"contrast": str(name), "mean": float(x.mean()), "hdi_low": low, "hdi_high": high,
                         "label": label(low, high, r_high).label if symmetric else ""})
        table = pd.DataFrame(rows, columns=["contrast", *TABLE_COLUMNS])
    if table.empty:
        raise ValueError("no contrasts to plot: pass at least one")
    values = table[["mean", "hdi_low", "hdi_high"]].apply(pd.to_numeric, errors="coerce")
    bad = table.loc[~np.isfinite(values.to_numpy(dtype=float)).all(axis=1), "contrast"].tolist()
    if bad:
        raise ValueError(f"contrast(s) {bad}: mean, hdi_low and hdi_high must be finite numbers")
    disorder = table.loc[values["hdi_low"] > values["hdi_high"], "contrast"].tolist()
    if disorder:
        raise ValueError(f"contrast(s) {disorder}: hdi_low exceeds hdi_high; pass (low, high) in order")
    table[["mean", "hdi_low", "hdi_high"]] = values
    if "scale" not in table.columns:
        table["scale"] = [SCALES.get(name, "") for name in table["contrast"]]
    table["scale"] = table["scale"].fillna("").astype(str)
    table["label"] = table["label"].fillna("").astype(str)
    table["rope_low"] = [ropes.get(c, default)[0] for c in table["contrast"]]
    table["rope_high"] = [ropes.get(c, default)[1] for c in table["contrast"]]
    # A missing "converged" column means the caller vouches for convergence (draws given directly).
    table["converged"] = table["converged"].fillna(False).astype(bool) if "converged" in table.columns else True
    return table[["contrast", *TABLE_COLUMNS, "scale", "rope_low", "rope_high", "converged"]]


def forest_plot(contrasts: Mapping[str, np.ndarray] | pd.DataFrame, rope: tuple[float, float], hdi_prob: float,
                title: str, ropes: Mapping[str, tuple[float, float]] | None = None) -> bytes:
    """H1-H5 and the gates with their HDIs and each row's ROPE shaded. Contrasts sit on
    their own scales (Δ, log-odds, d′, standardised), so each row's label names its scale
    and its ROPE is drawn behind that row only; ``rope`` is the registered ±SESOI, and
    ``ropes`` overrides it per contrast (gate (c): ±0.15/sigma on the standardised scale).
    A row whose ``converged`` column is False is drawn grey, dashed and hatched and captioned
    "not converged — not to be read" (6.1: a label is read only from a converged fit)."""
    table = contrast_table(contrasts, rope, hdi_prob, ropes)
    n = len(table)
    fig, ax = _figure(7.0, 0.9 + 0.45 * n)
    ax.axvline(0.0, color="black", linewidth=0.8, zorder=1)
    y = np.arange(n)[::-1]
    for yi, row in zip(y, table.itertuples(index=False)):
        ax.fill_betweenx([yi - 0.45, yi + 0.45], row.rope_low, row.rope_high, color="#d9d9d9", alpha=0.8,
                         linewidth=0, zorder=0)
        colour, _ = row_style(row.label, row.converged)
        if not row.converged:
            ax.fill_betweenx([yi - 0.2, yi + 0.2], row.hdi_low, row.hdi_high, facecolor="none", hatch="///",
                             edgecolor=colour, linewidth=0, zorder=2)
        ax.hlines(yi, row.hdi_low, row.hdi_high, color=colour, linewidth=2.2, zorder=2,
                  linestyles="solid" if row.converged else "dashed")
        ax.plot(row.mean, yi, "o" if row.converged else "x", color=colour, zorder=3)
    ax.set_yticks(y, forest_row_labels(table))
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel(f"posterior mean and {hdi_prob:.0%} HDI; shaded: each contrast's ROPE on its own scale")
    ax.set_title(title)
    return _png(fig)


def _chains_of(draws: np.ndarray, chains: int) -> np.ndarray:
    x = np.asarray(draws, dtype=float).ravel()
    chains = chains if chains >= 1 and x.size % chains == 0 and x.size // chains >= 2 else 1
    return x.reshape(chains, -1)


def trace_plot(name: str, draws: np.ndarray, chains: int) -> bytes:
    """ArviZ's trace plot of one contrast's draws (chain-major, ``chains`` chains): the
    density and the trace of each chain, drawn on an off-screen figure."""
    import arviz as az

    data = az.from_dict(posterior={name: _chains_of(draws, chains)})
    fig = _blank_figure(7.0, 1.8)
    axes = np.array([fig.subplots(1, 2)])
    az.plot_trace(data, var_names=[name], axes=axes, compact=False, show=False)
    axes[0, 0].set_title(f"{name}: posterior by chain", fontsize="small")
    axes[0, 1].set_title(f"{name}: trace", fontsize="small")
    return _png(fig)


def rank_plot(name: str, draws: np.ndarray, chains: int) -> bytes:
    """ArviZ's rank plot of one contrast's draws: a well-mixed fit has flat rank histograms."""
    import arviz as az

    data = az.from_dict(posterior={name: _chains_of(draws, chains)})
    fig, ax = _figure(3.5, 1.8)
    az.plot_rank(data, var_names=[name], ax=ax, show=False)
    ax.set_title(f"{name}: rank by chain", fontsize="small")
    return _png(fig)


def diagnostic_plots(draws: Mapping[str, np.ndarray], chains: int) -> dict[str, tuple[bytes, bytes]]:
    """Trace and rank plots (PNG bytes) of every contrast in ``draws``, by contrast."""
    return {name: (trace_plot(name, x, chains), rank_plot(name, x, chains)) for name, x in draws.items()}


def delta_by_depth_plot(table: pd.DataFrame) -> bytes:
    """Delta by depth for the six agent x content cells (colour: agent; line: content),
    with intervals. Depths sit at evenly spaced positions labelled with their token
    counts, because the registered depths double and include 0 (no log axis fits)."""
    missing = [c for c in DEPTH_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"depth table lacks column(s) {missing}; it needs {list(DEPTH_COLUMNS)}, one row per "
                         "agent x content x depth")
    if table.empty:
        raise ValueError("depth table is empty: pass one row per agent x content x depth")
    numeric = table[["depth_tokens", "mean", "low", "high"]].apply(pd.to_numeric, errors="coerce")
    if not np.isfinite(numeric.to_numpy(dtype=float)).all():
        raise ValueError("depth table: depth_tokens, mean, low and high must be finite numbers on every row")
    if (numeric["low"] > numeric["high"]).any():
        rows = list(table.index[(numeric["low"] > numeric["high"]).to_numpy()][:5])
        raise ValueError(f"depth table rows {rows}: low exceeds high; pass (low, high) in order")
    if table.duplicated(["agent", "content", "depth_tokens"]).any():
        raise ValueError("depth table repeats an agent x content x depth; pass one row per cell and depth")
    data = table.assign(**{c: numeric[c] for c in numeric.columns})
    depths = sorted(data["depth_tokens"].unique())
    position = {d: i for i, d in enumerate(depths)}
    agents = list(dict.fromkeys(data["agent"]))
    contents = list(dict.fromkeys(data["content"]))
    import matplotlib

    palette = matplotlib.colormaps["tab10"]
    styles = ["-", "--", ":", "-."]
    fig, ax = _figure(7.5, 4.2)
    offset = np.linspace(-0.12, 0.12, max(len(agents) * len(contents), 1))
    k = 0
    for i, agent in enumerate(agents):
        for j, content in enumerate(contents):
            cell = data[(data["agent"] == agent) & (data["content"] == content)].sort_values("depth_tokens")
            if cell.empty:
                continue
            x = np.array([position[d] for d in cell["depth_tokens"]]) + offset[k]
            k += 1
            ax.errorbar(x, cell["mean"], yerr=[cell["mean"] - cell["low"], cell["high"] - cell["mean"]],
                        color=palette(i % 10), linestyle=styles[j % len(styles)], marker="o", markersize=3.5,
                        capsize=2, label=f"{agent} · {content}")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(depths)), [f"{int(d):,}" if float(d).is_integer() else f"{d:g}" for d in depths])
    ax.set_xlabel("distractor depth (tokens)")
    ax.set_ylabel("Δ (agent minus partner report score)")
    ax.legend(fontsize="small", ncol=2, frameon=False)
    return _png(fig)


def markdown_image(png: bytes, alt: str) -> str:
    """A Markdown image with a base64 data URI, which Dagster's UI renders from
    ``dg.MetadataValue.md``; the alt text is kept on one line without brackets so it
    cannot break the Markdown."""
    if not isinstance(png, (bytes, bytearray)) or not bytes(png).startswith(PNG_MAGIC):
        raise ValueError("markdown_image needs PNG bytes (from forest_plot or delta_by_depth_plot); "
                         "the input does not start with the PNG signature")
    clean = " ".join(str(alt).replace("[", "(").replace("]", ")").split())
    return f"![{clean}](data:image/png;base64,{base64.b64encode(bytes(png)).decode('ascii')})"
