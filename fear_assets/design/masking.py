"""D6 masking: condition codes replace (condition, agent, content) in the trial table.

The code assignment is a seeded permutation per configuration; the assignment key
(code -> condition, agent, content, cell index) is a separate table that only the
unmasking step reads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fear_assets.design.trials import BINDING_CELLS, block_applies
from fear_assets.core.hashing import derived_seed
from fear_assets.core.settings import ProtocolSettings

KEY_COLUMNS = ["family", "condition_code", "condition", "agent", "content", "cell_index"]
#: Columns that reveal the condition and therefore never enter the masked trial table.
UNMASKED_COLUMNS = ["condition", "agent", "content", "cell_index"]


def condition_combinations(settings: ProtocolSettings, family_key: str) -> list[tuple[str, str, str, int]]:
    """Every (condition, agent, content, cell index) the family's design can contain, sorted."""
    family = settings.family(family_key)
    combos: set[tuple[str, str, str, int]] = set()
    for block in settings.blocks:
        if not block_applies(block, family):
            continue
        if block.kind in ("baseline", "no_agent"):
            combos.add((block.condition, "none", "none", 0))
            continue
        cell_set = BINDING_CELLS if block.kind == "binding" else block.cells
        for i, (agent, content) in enumerate(settings.cell_set(cell_set), start=1):
            combos.add((block.condition, agent, content, i))
    return sorted(combos)


def assignment_key(settings: ProtocolSettings, family_key: str) -> pd.DataFrame:
    """The seeded code assignment of one configuration (D6)."""
    combos = condition_combinations(settings, family_key)
    rng = np.random.default_rng(derived_seed(settings.master_seed, "masking", family_key))
    order = rng.permutation(len(combos))
    width = max(2, len(str(len(combos))))
    rows = [
        {"family": family_key, "condition_code": f"C{int(code) + 1:0{width}d}", "condition": c, "agent": a,
         "content": ct, "cell_index": ci}
        for (c, a, ct, ci), code in zip(combos, order)
    ]
    return pd.DataFrame(rows, columns=KEY_COLUMNS).sort_values("condition_code", ignore_index=True)


def mask(grid: pd.DataFrame, key: pd.DataFrame) -> pd.DataFrame:
    """Replace the unmasked condition columns by their code; refuses unknown combinations."""
    merged = grid.merge(key.drop(columns="family"), on=UNMASKED_COLUMNS, how="left", validate="many_to_one")
    missing = merged["condition_code"].isna()
    if missing.any():
        example = merged.loc[missing, UNMASKED_COLUMNS].iloc[0].to_dict()
        raise ValueError(f"{int(missing.sum())} trials have no condition code (e.g. {example}); "
                         "the assignment key and the design disagree: rebuild both from the same settings")
    return merged.drop(columns=UNMASKED_COLUMNS)
