import pandas as pd
import pytest

from fear_assets.analysis.unmasking import scoring_lock, unmask
from fear_assets.core.errors import FreezeError

FROZEN = {"settings_sha256": "s" * 64, "bank_sha256": "b" * 64}
KEY = pd.DataFrame({"condition_code": ["C01", "C02"], "condition": ["default"] * 2, "agent": ["self", "peer"],
                    "content": ["threat", "threat"], "cell_index": [1, 3], "depth": ["d1", "d1"]})


def _scores(depths, settings_hash="s" * 64):
    return pd.DataFrame({"depth": depths, "settings_sha256": settings_hash, "bank_sha256": "b" * 64})


def test_unmasking_refuses_until_every_depth_is_scored_from_frozen_inputs():
    table = pd.DataFrame({"trial_id": ["t1", "t2"], "condition_code": ["C02", "C01"]})
    with pytest.raises(FreezeError, match="not scored: d2"):
        unmask(table, KEY, ["d1", "d2"], _scores(["d1"]), FROZEN)
    assert scoring_lock(["d1"], _scores(["d1"], "x" * 64), FROZEN)[0].startswith("scores built from settings_sha256")
    out = unmask(table, KEY, ["d1", "d2"], _scores(["d1", "d2"]), FROZEN)
    assert out.agent.tolist() == ["peer", "self"] and out.cell_index.tolist() == [3, 1]
