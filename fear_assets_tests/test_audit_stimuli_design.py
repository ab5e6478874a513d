"""Issue 10, part C: registered-rule corrections in the stimuli, the design and matching
(protocol 4.2, 4.3, 4.7). Each test fails on the code before the correction."""

import itertools
import json
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import pytest

from fear_assets.design.accounting import trial_accounting
from fear_assets.design.masking import assignment_key, mask
from fear_assets.design.trials import build_grid, registered_selection
from fear_assets.pilot.matching import equivalence, frame_differences
from fear_assets.resources.models import LanguageModelResource

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


# ---------------------------------------------------------------------------------------
# Item 7: sentence surprisal uses the name gate's selection, like the documents
# ---------------------------------------------------------------------------------------
#: A selection other than the first five in registered order (as if Orin failed the gate).
GATE_SELECTION = ["Tavi", "Kemi", "Sora", "Pell", "Nami"]


class TinyLanguageModel(LanguageModelResource):
    """The embedded tokenizer with a tiny random model: the asset's wiring, not the model, is tested."""

    def load(self, spec):
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        from fear_assets.lm.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(spec.checkpoint, Path(self.cache_dir))
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
        return AutoModelForCausalLM.from_config(config).eval(), tokenizer


@pytest.fixture(scope="module")
def gate_store(tmp_path_factory, settings, smol_tokenizer):
    """frame_bank, a name_gate whose stored selection is GATE_SELECTION and sentence_surprisal
    of the embedded family, through Dagster and DuckDB."""
    from fear_assets.definitions import all_assets, all_checks, resources
    from fear_assets.lm.tokenizers import GGUF_PACKAGE_PREFIX
    from fear_assets.resources.store import SCHEMA

    tmp = tmp_path_factory.mktemp("gate_store")
    db, cache = str(tmp / "store.duckdb"), str(tmp / "cache")
    # The session's embedded tokenizer, saved where load_tokenizer looks (saves its GGUF extraction).
    checkpoint = settings.family(EMBEDDED).tested
    smol_tokenizer.save_pretrained(Path(cache) / "tokenizers" /
                                   checkpoint[len(GGUF_PACKAGE_PREFIX):].replace(".gguf", ""))
    res = {**resources(db, cache_dir=cache), "language_model": TinyLanguageModel(cache_dir=cache)}
    instance = dg.DagsterInstance.ephemeral()

    def run(selection, key=None):
        return dg.materialize([*all_assets, *all_checks], selection=selection, partition_key=key, instance=instance,
                              resources=res)

    run(["frame_bank"])
    # The stored gate outcome (its columns that later assets read), written directly: running
    # the gate itself costs about 20 s here and is tested in test_name_gate / test_dagster.
    gate = pd.DataFrame({"family": EMBEDDED, "name": list(settings.names), "selected_names": json.dumps(GATE_SELECTION),
                         "gate_passed": True})
    with duckdb.connect(db) as con:
        con.execute(f"create schema if not exists {SCHEMA}")
        con.execute(f"create table {SCHEMA}.name_gate as select * from gate")
    run(["sentence_surprisal"], EMBEDDED)
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(f"select * from {SCHEMA}.sentence_surprisal").df()


def test_audit_selected_names_in_surprisal(gate_store, settings):
    """4.2/4.3: sentence surprisal (and so matching, its TOST and the surprisal covariates)
    is measured with the name gate's selection, the names the documents carry; it used the
    first five names in registered order."""
    from fear_assets.design.documents import role_names

    surprisal = gate_store
    agents = surprisal[surprisal["agent"].isin(["self", "peer", "person"])]
    assert not agents["sentence"].str.contains(r"\bOrin\b").any()
    for rotation, part in agents.groupby("rotation"):
        names = role_names(settings, GATE_SELECTION, int(rotation))
        for agent in ("self", "peer", "person"):
            assert part.loc[part["agent"] == agent, "sentence"].str.startswith(names[agent] + " ").all()
    # The name token(s) are located in the selected name, so the non-name statistic excludes it.
    assert (agents["n_name_tokens"] >= 1).all()
    from fear_assets.lm.surprisal import require_same_names, surprisal_names

    assert surprisal_names(surprisal) == GATE_SELECTION
    require_same_names(surprisal, GATE_SELECTION, "test")  # the names the documents carry (trial_table)
    # A table measured with other names is refused where surprisal meets the documents.
    with pytest.raises(ValueError, match="re-materialise sentence_surprisal"):
        require_same_names(surprisal, list(settings.names[:5]), "posteriors")
