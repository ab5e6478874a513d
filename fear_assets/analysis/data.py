"""Model tables from unmasked trial scores (protocol 6.1): one row per trial with the
registered factors, the frame and unit, and the two document-independent surprisal
covariates (the agent sentence's name-token NLL, and its rest NLL minus the neutral
partner's), matched on frame, rotation, agent, content and shown option."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from fear_assets.analysis.primary_model import COVARIATES, PrimaryData, prepare

AGENTS = ("self", "peer", "person")
CONTENTS = ("threat", "harmless")


def model_table(scores: pd.DataFrame, surprisal: pd.DataFrame, fears_of: dict[str, str], neutral_option: int,
                outcome: str = "delta") -> pd.DataFrame:
    """``scores``: unmasked rows (agent, content, condition joined) of the blocks to model.
    Rows without the outcome (excluded trials) are dropped; the caller reports how many."""
    d = scores.copy()
    d = d[d[outcome].notna() & ~d["excluded_context"].astype(bool)]
    agent = surprisal[surprisal["agent"] != "partner"][["item_id", "rotation", "agent", "content", "option",
                                                        "name_nll", "rest_nll"]]
    partner = surprisal[(surprisal["agent"] == "partner") & (surprisal["option"] == neutral_option)][
        ["item_id", "rotation", "rest_nll"]].rename(columns={"rest_nll": "partner_rest_nll"})
    d = d.rename(columns={"content_option": "option"})
    d = d.merge(agent, on=["item_id", "rotation", "agent", "content", "option"], how="left")
    d = d.merge(partner, on=["item_id", "rotation"], how="left")
    d["surprisal_name"] = d["name_nll"]
    d["surprisal_rest"] = d["rest_nll"] - d["partner_rest_nll"]
    d["frame"] = d["item_id"]
    d["fear"] = d["item_id"].map(fears_of)
    d["unit"] = d["item_id"] + "|r" + d["rotation"].astype(str) + "|o" + d["order"].astype(str) + "|" + d["depth"]
    d["outcome"] = d[outcome].astype(float)
    return d.reset_index(drop=True)


def levels_of(data: pd.DataFrame, fears: Sequence[str], agents: Sequence[str] = AGENTS) -> dict[str, list]:
    """Factor levels present in the data (registered order for agent, content, fear)."""
    present = lambda col: sorted(data[col].unique(), key=str)
    return {"agent": [a for a in agents if a in set(data["agent"])], "content": list(CONTENTS),
            "depth": present("depth"), "order": present("order"), "option": present("option"),
            "rotation": present("rotation"), "fear": [f for f in fears if f in set(data["fear"])] or ["none"]}


def prepared(data: pd.DataFrame, levels: dict, covariates: Sequence[str] = COVARIATES) -> PrimaryData:
    """PrimaryData with covariates that exist for every row (agents outside the surprisal
    table, e.g. the addressee control's, have none: those fits drop the covariates)."""
    usable = tuple(c for c in covariates if data[c].notna().all())
    return prepare(data, levels, outcome="outcome", covariates=usable)
