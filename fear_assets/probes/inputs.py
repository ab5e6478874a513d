"""The probe's inputs from the scores (protocol 4.5 Branch 3, Appendix B): residual features
of the scored rows, read from their checksummed files, and the no-agent-sentence control's
label: the option its probe twin shows (:func:`no_agent_labels`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fear_assets.models.data import kept
from fear_assets.core.hashing import sha256_file
from fear_assets.core.settings import depth_index

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
    """(X, documents, X of the no-agent documents, their twin labels) for one frame set."""
    agent_blocks, no_agent_block = blocks[:2], blocks[2]
    scores = kept(scores)  # 4.8: an excluded trial (over the window, truncated answer) enters no probe
    docs = scores[scores["block"].isin(agent_blocks) & (scores["feature_row"] >= 0)].copy()
    docs["depth_index"] = docs["depth"].map(depth_index).astype(int)
    X = load_features(docs)
    no_agent = scores[(scores["block"] == no_agent_block) & (scores["feature_row"] >= 0)].copy()
    if no_agent.empty:
        return X, docs.reset_index(drop=True), None, None
    no_agent["depth_index"] = no_agent["depth"].map(depth_index).astype(int)
    labelled = no_agent_labels(no_agent.drop(columns="content_option").reset_index(),
                               docs[docs["block"] == agent_blocks[0]])
    Xna = load_features(no_agent)[no_agent.index.get_indexer(labelled["index"])]
    return X, docs.reset_index(drop=True), Xna, labelled


UNIT = ["item_id", "rotation", "order", "depth_index"]


def no_agent_labels(no_agent: pd.DataFrame, primary: pd.DataFrame) -> pd.DataFrame:
    """One label per no-agent document (4.5: an informative control): the option shown by its
    probe twin, the unit's primary document in the configuration's lowest condition code.

    Scoring a no-agent document against all six cells of its unit gives accuracy 0.5 by
    construction (the option rule splits a unit 3:3), so no leak could show. Against one
    twin it is decodable exactly when the agent documents' option leaks into the no-agent
    features (a misaligned feature row, state carried over from a neighbouring document).
    The lowest code is one fixed cell per configuration, chosen without unmasking which;
    which cell does not matter: the option rule gives every odd cell one option and every
    even cell the other, so another twin gives accuracy 1 - a and the two-sided chance test
    the same verdict. A unit whose twin was excluded (4.8) has no label and is left out."""
    if primary.empty:
        return no_agent.iloc[0:0].assign(twin_condition_code=pd.Series(dtype=str), content_option=pd.Series(dtype=int))
    twin = sorted(primary["condition_code"].unique())[0]
    twins = primary.loc[primary["condition_code"] == twin, UNIT + ["condition_code", "content_option"]]
    twins = twins.rename(columns={"condition_code": "twin_condition_code"})
    return no_agent.merge(twins, on=UNIT, how="inner", validate="many_to_one")
