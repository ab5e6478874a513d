"""Issue 10, part C: registered-rule corrections in the stimuli, the design and matching
(protocol 4.2, 4.3, 4.7). Each test fails on the code before the correction."""

import itertools

import numpy as np
import pandas as pd
import pytest

from fear_assets.design.accounting import trial_accounting
from fear_assets.design.masking import assignment_key, mask
from fear_assets.design.trials import build_grid, registered_selection
from fear_assets.pilot.matching import equivalence, frame_differences

from fear_assets_tests.conftest import EMBEDDED


# ---------------------------------------------------------------------------------------
# Minor: the binding block's accounting rule agrees with its message and with 4.2
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded_table(settings, bank):
    grid = build_grid(settings, bank, EMBEDDED)
    return mask(grid, assignment_key(settings, EMBEDDED))


def _binding_accounting(settings, bank, table):
    selection = registered_selection(settings, bank, settings.family(EMBEDDED))
    return trial_accounting(settings, EMBEDDED, selection, table).set_index("block").loc["pilot_binding_in_context"]


def test_audit_binding_accounting_spread(settings, bank, embedded_table):
    """4.2: the 40 in-context documents are "spread evenly over names, roles and contents":
    over the six role x content cells that is 7, 7, 7, 7, 6, 6 (counts differ by at most one,
    every cell present). A deal of 9, 5, 7, 7, 6, 6 (still 40 documents) is a mismatch."""
    ok = _binding_accounting(settings, bank, embedded_table)
    assert ok.status == "ok" and ok.codes == 6 and ok.codes_off == 0
    binding = embedded_table[embedded_table.block == "pilot_binding_in_context"]
    counts = binding.groupby("condition_code").size().sort_values(ascending=False)
    assert sorted(counts.tolist()) == [6, 6, 7, 7, 7, 7]
    # Move two documents from the smallest cell to the largest: spread 4, fewer than six codes.
    small, large = counts.index[-1], counts.index[0]
    moved = binding.index[binding.condition_code == small][:2]
    uneven = embedded_table.copy()
    uneven.loc[moved, "condition_code"] = large
    bad = _binding_accounting(settings, bank, uneven)
    assert len(uneven) == len(embedded_table) and bad.actual_rows == bad.expected_rows == 40
    assert bad.status == "MISMATCH" and bad.codes_off == 2  # 9 and 4 lie outside 6..7
    # A cell that vanishes entirely counts as off, although the other counts may look even.
    gone = embedded_table.copy()
    gone.loc[binding.index[binding.condition_code == small], "condition_code"] = large
    assert _binding_accounting(settings, bank, gone).status == "MISMATCH"


# ---------------------------------------------------------------------------------------
# Minor: the TOST has one mean difference per frame
# ---------------------------------------------------------------------------------------
def _surprisal(frame_shift: dict[str, float], noise: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for item in frame_shift:
        for rot, opt, agent, content in itertools.product((1, 2, 3), (1, 2), ("self", "peer", "person"),
                                                          ("threat", "harmless")):
            shift = frame_shift[item] if (agent, content) == ("self", "threat") else 0.0
            rows.append({"item_id": item, "fear": "a", "frame_set": "confirmatory", "rotation": rot, "option": opt,
                         "agent": agent, "content": content, "rest_nll": 4.0 + shift + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_audit_tost_frame_level():
    """4.3: "across the retained bank" the unit is the frame. Two frames whose self
    threat-minus-harmless differences are 0.00 and 0.06 are not shown equivalent within
    +-0.05 (n = 2 frames); counting each frame's 6 rotation x option rows as independent
    observations (n = 12) used to pass them."""
    diffs = frame_differences(_surprisal({"A-03": 0.0, "A-04": 0.06}, noise=0.002, seed=3))
    table = equivalence(diffs, {"A-03", "A-04"}, 0.05).set_index("comparison")
    row = table.loc["self: threat - harmless"]
    assert row.n == 2 and row.mean_difference == pytest.approx(0.03, abs=0.002)
    assert row.tost_p > 0.05
    # Agent-pair comparisons average both contents within the frame: still one row per frame.
    assert table.loc["self - peer", "n"] == 2
    # Many frames close to zero are equivalent at the frame level.
    many = {f"A-{i:02d}": s for i, s in zip(range(3, 13), np.linspace(-0.01, 0.01, 10))}
    close = equivalence(frame_differences(_surprisal(many, noise=0.002, seed=4)), set(many), 0.05)
    assert (close["n"] == 10).all() and (close["tost_p"] < 0.05).all()
    # One frame: the test is undefined and so never passes.
    one = equivalence(diffs, {"A-03"}, 0.05)
    assert one["tost_p"].isna().all()
