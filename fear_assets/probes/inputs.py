"""The probe's inputs from the scores (protocol 4.5 Branch 3, Appendix B): residual features
of the scored rows, read from their checksummed files, and the no-agent-sentence control's
labels (the option each cell's document of the same unit shows: codes, never cells, so the
analysis stays masked)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fear_assets.analysis.data import kept
from fear_assets.hashing import sha256_file
from fear_assets.settings import depth_index

#: Blocks probed per frame set: the two agent blocks (shown option, other option) and the
#: no-agent control block (6.1).
PROBE_BLOCKS = {"pilot": ("pilot_primary", "pilot_probe_other_option", "pilot_probe_no_agent"),
                "confirmatory": ("primary", "probe_other_option", "probe_no_agent")}


def load_features(scored: pd.DataFrame) -> np.ndarray:
    """Features of the scored rows (in their order), from their checksummed files (Appendix B)."""
    parts = []
    for (path, digest), part in scored.groupby(["features_file", "features_sha256"], sort=False):
        if sha256_file(path) != digest:
            raise ValueError(f"{path}: sha256 differs from the one recorded in the scores; re-materialise them")
        parts.append(pd.DataFrame(np.load(path)[part["feature_row"].to_numpy()], index=part.index))
    if not parts:
        return np.zeros((len(scored), 0), np.float32)
    return pd.concat(parts).loc[scored.index].to_numpy(np.float32)


def probe_inputs(scores: pd.DataFrame, blocks: tuple[str, str, str]):
    """(X, documents, X of the no-agent documents, their expanded labels) for one frame set."""
    agent_blocks, no_agent_block = blocks[:2], blocks[2]
    scores = kept(scores)  # 4.8: an excluded trial (over the window, truncated answer) enters no probe
    docs = scores[scores["block"].isin(agent_blocks) & (scores["feature_row"] >= 0)].copy()
    docs["depth_index"] = docs["depth"].map(depth_index).astype(int)
    X = load_features(docs)
    no_agent = scores[(scores["block"] == no_agent_block) & (scores["feature_row"] >= 0)].copy()
    if no_agent.empty:
        return X, docs.reset_index(drop=True), None, None
    no_agent["depth_index"] = no_agent["depth"].map(depth_index).astype(int)
    primary = docs[docs["block"] == agent_blocks[0]][["item_id", "rotation", "order", "depth_index",
                                                      "condition_code", "content_option"]]
    expanded = no_agent.drop(columns=["condition_code", "content_option"]).reset_index().merge(
        primary, on=["item_id", "rotation", "order", "depth_index"])
    Xna = load_features(no_agent)[no_agent.index.get_indexer(expanded["index"])]
    return X, docs.reset_index(drop=True), Xna, expanded
