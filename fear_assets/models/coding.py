"""Sum-to-zero (deviation) coding, R's ``contr.sum`` (D3b).

Each coefficient is a level's deviation from the mean over levels, the last level implied;
interactions are products of those columns. Averaging a cell mean over a factor's levels at
design balance therefore sets that factor's columns to zero.
"""

from __future__ import annotations

from itertools import product
from typing import Mapping, Sequence

import numpy as np
import pandas as pd


def sum_columns(values: Sequence, levels: Sequence) -> np.ndarray:
    """n x (k-1) deviation-coded columns of a factor with ``levels`` (last level implied)."""
    levels = list(levels)
    index = {level: i for i, level in enumerate(levels)}
    unknown = set(values) - set(levels)
    if unknown:
        raise ValueError(f"values {sorted(map(str, unknown))} are not among the levels {levels}")
    out = np.zeros((len(values), len(levels) - 1))
    for row, v in enumerate(values):
        i = index[v]
        if i == len(levels) - 1:
            out[row, :] = -1.0
        else:
            out[row, i] = 1.0
    return out


def interaction(*blocks: np.ndarray) -> np.ndarray:
    """Row-wise products of every combination of the blocks' columns."""
    n = blocks[0].shape[0]
    cols = [np.prod([b[:, j] for b, j in zip(blocks, combo)], axis=0)
            for combo in product(*(range(b.shape[1]) for b in blocks))]
    return np.column_stack(cols) if cols else np.zeros((n, 0))


def factor_names(name: str, levels: Sequence) -> list[str]:
    return [f"{name}[{level}]" for level in list(levels)[:-1]]


def design(data: pd.DataFrame, levels: Mapping[str, Sequence], covariates: Sequence[str] = ()) -> tuple[np.ndarray, list[str]]:
    """Fixed-effect matrix of the primary model (no intercept column): agent x content x
    depth with all interactions, then order, option, rotation, fear and the covariates."""
    a = sum_columns(data["agent"], levels["agent"])
    c = sum_columns(data["content"], levels["content"])
    d = sum_columns(data["depth"], levels["depth"])
    blocks = [a, c, d, interaction(a, c), interaction(a, d), interaction(c, d), interaction(a, c, d)]
    names = [*factor_names("agent", levels["agent"]), *factor_names("content", levels["content"]),
             *factor_names("depth", levels["depth"])]
    fa, fc, fd = (factor_names(k, levels[k]) for k in ("agent", "content", "depth"))
    names += [f"{x}:{y}" for x in fa for y in fc] + [f"{x}:{y}" for x in fa for y in fd] + \
             [f"{x}:{y}" for x in fc for y in fd] + [f"{x}:{y}:{z}" for x in fa for y in fc for z in fd]
    for factor in ("order", "option", "rotation", "fear"):
        blocks.append(sum_columns(data[factor], levels[factor]))
        names += factor_names(factor, levels[factor])
    for cov in covariates:
        blocks.append(data[[cov]].to_numpy(dtype=float))
        names.append(cov)
    return np.column_stack(blocks), names


def frame_slopes(data: pd.DataFrame, levels: Mapping[str, Sequence]) -> np.ndarray:
    """The six frame-level effects' columns: 1, agent (2), content (1), agent x content (2)."""
    a = sum_columns(data["agent"], levels["agent"])
    c = sum_columns(data["content"], levels["content"])
    return np.column_stack([np.ones(len(data)), a, c, interaction(a, c)])


def cell_row(agent: str, content: str, depth, levels: Mapping[str, Sequence], n_covariates: int) -> np.ndarray:
    """Design row of one agent x content x depth cell with every other factor averaged out
    (its sum-coded columns at zero) and the centred covariates at their mean."""
    frame = pd.DataFrame({"agent": [agent], "content": [content], "depth": [depth],
                          "order": [levels["order"][0]], "option": [levels["option"][0]],
                          "rotation": [levels["rotation"][0]], "fear": [levels["fear"][0]]})
    row, names = design(frame, levels)
    nuisance = [i for i, n in enumerate(names) if n.split("[")[0] in ("order", "option", "rotation", "fear")]
    row[0, nuisance] = 0.0
    return np.concatenate([row[0], np.zeros(n_covariates)])
