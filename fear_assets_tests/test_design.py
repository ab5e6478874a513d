"""The design generator on the full registered design (no tokenizer needed)."""

import hashlib

import pandas as pd
import pytest

from fear_assets.design.accounting import trial_accounting
from fear_assets.design.masking import assignment_key, condition_combinations, mask
from fear_assets.design.trials import build_grid, content_option, registered_selection

from fear_assets_tests.conftest import EMBEDDED, PRIMARY


@pytest.fixture(scope="module")
def grid(settings, bank):
    return build_grid(settings, bank, PRIMARY)


def test_registered_counts(grid):
    sizes = grid.groupby("block").size()
    assert sizes["primary"] == 14_400
    assert grid.loc[grid.block == "primary", "item_id"].nunique() == 50
    assert sizes["baseline"] == 1_200
    assert sizes["primary"] + sizes["probe_other_option"] == 28_800
    assert sizes["pilot_binding_in_context"] == 40
    assert sizes["protective_choice"] == 50 * 2 * 3 * 2


def test_a_probe_training_fold_has_384_documents(grid):
    probe = grid[grid.block.isin(["primary", "probe_other_option"])]
    frame = probe.item_id.iloc[0]
    fold = probe[(probe.item_id == frame) & probe.rotation.isin([1, 2])]
    assert len(fold) == 384
    # Both content versions of every document: the option is fully crossed.
    per_doc = fold.groupby(["rotation", "order", "depth_index", "cell_index"]).content_option.agg(frozenset)
    assert (per_doc == frozenset({1, 2})).all()


def test_option_rule_balance_as_stated_in_4_3(grid):
    primary = grid[grid.block == "primary"]
    # Within every cell and depth (of a frame), three of the six documents show each option.
    per_cell_depth = primary.groupby(["item_id", "cell_index", "depth_index"]).content_option.agg(
        lambda s: (s == 1).sum())
    assert (per_cell_depth == 3).all()
    # Every rotation-by-order combination contains both options.
    per_k = primary.groupby(["item_id", "rotation_order_index", "depth_index"]).content_option.nunique()
    assert (per_k == 2).all()
    per_k_cell = primary.groupby(["item_id", "rotation_order_index", "cell_index"]).content_option.nunique()
    assert (per_k_cell == 2).all()
    # The option is not a function of order and depth across the cells of a unit.
    per_unit = primary.groupby(["item_id", "rotation", "order", "depth_index"]).content_option.nunique()
    assert (per_unit == 2).all()
    # The neutral partner always shows option 1.
    assert (primary.partner_option == 1).all()


def test_option_rule_formula(settings):
    # k = rotation + 3 (order - 1); option 1 iff k + depth + cell is even.
    assert content_option(settings, rotation=1, order=1, depth_index=1, cell_index=2) == 1
    assert content_option(settings, rotation=1, order=2, depth_index=1, cell_index=2) == 2  # k = 4
    assert content_option(settings, rotation=3, order=2, depth_index=8, cell_index=6) == 1  # 6 + 8 + 6 = 20
    assert content_option(settings, rotation=2, order=1, depth_index=3, cell_index=5) == 1  # 2 + 3 + 5 = 10
    assert content_option(settings, rotation=2, order=1, depth_index=4, cell_index=5) == 2


def test_forced_choice_order_is_counterbalanced_against_the_shown_option(grid):
    primary = grid[grid.block == "primary"]
    table = primary.groupby(["cell_index", "content_option", "fc_first_listed"]).size().unstack()
    assert table.notna().all().all() and (table.values == table.values.flat[0]).all()


def test_judge_introduces_both_assistants_first_equally_often(grid):
    judge = grid[grid.block == "judge"]
    counts = judge.groupby(["cell_index", "judge_self_first"]).size().unstack()
    assert (counts[True] == counts[False]).all()


def test_binding_documents_are_spread_evenly(grid, settings):
    binding = grid[grid.block == "pilot_binding_in_context"]
    assert (binding.depth_index == settings.family(PRIMARY).deepest_index).all()
    for column in ("item_id", "agent", "content", "rotation"):
        counts = binding[column].value_counts()
        assert counts.max() - counts.min() <= 1, column
    # names: each selected name serves as each role about equally often
    names = binding.apply(lambda r: settings.rotations[r.rotation][["self", "peer", "person"].index(r.agent)], axis=1)
    assert names.value_counts().max() - names.value_counts().min() <= 1


def test_accounting_is_closed_on_the_full_design(settings, bank, grid):
    key = assignment_key(settings, PRIMARY)
    table = mask(grid, key)
    accounting = trial_accounting(settings, PRIMARY, registered_selection(settings, bank, settings.family(PRIMARY)),
                                  table)
    assert (accounting.status.isin(["ok"])).all(), accounting[accounting.status != "ok"]
    total = accounting.set_index("block").loc["TOTAL"]
    assert total.actual_rows == len(grid) == accounting[accounting.block != "TOTAL"].actual_rows.sum()


def test_accounting_detects_a_missing_and_a_duplicated_trial(settings, bank, grid):
    key = assignment_key(settings, PRIMARY)
    table = mask(grid, key)
    selection = registered_selection(settings, bank, settings.family(PRIMARY))
    broken = pd.concat([table.iloc[1:], table.iloc[[5]]])  # one primary trial lost, another doubled
    accounting = trial_accounting(settings, PRIMARY, selection, broken).set_index("block")
    assert accounting.loc["primary", "status"] == "MISMATCH"
    assert accounting.loc["primary", "codes_off"] >= 1


def test_embedded_family_has_no_base_blocks_and_says_why(settings, bank):
    grid = build_grid(settings, bank, EMBEDDED)
    assert not grid.block.str.startswith("base_checkpoint").any()
    selection = registered_selection(settings, bank, settings.family(EMBEDDED))
    acc = trial_accounting(settings, EMBEDDED, selection, mask(grid, assignment_key(settings, EMBEDDED)))
    base = acc.set_index("block").loc["base_checkpoint"]
    assert base.status == "not applicable" and "no base checkpoint" in base.formula
    assert (acc.status != "MISMATCH").all()


def test_masking_key_is_a_seeded_permutation(settings, grid):
    key = assignment_key(settings, PRIMARY)
    assert key.condition_code.is_unique and len(key) == len(condition_combinations(settings, PRIMARY))
    assert key.equals(assignment_key(settings, PRIMARY))
    other = assignment_key(settings, "llama-3.1-8b")
    merged = key.merge(other, on=["condition", "agent", "content"])
    assert (merged.condition_code_x != merged.condition_code_y).any()  # per configuration
    masked = mask(grid.head(500), key)
    assert not {"agent", "content", "cell_index", "condition"} & set(masked.columns)


def test_two_builds_are_byte_identical(settings, bank, grid):
    again = build_grid(settings, bank, PRIMARY)
    digest = lambda df: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
    assert digest(again) == digest(grid)


# -- a reduced design's thinned depth (issue 26: the demo's third depth at one rotation) -------
def _thinned(settings, kept: dict):
    """The embedded family with ``kept`` (depth key -> rotations) as its thinned depths."""
    import dataclasses

    family = settings.family(EMBEDDED)
    reduced = dataclasses.replace(family.reduced_design, rotations_by_depth=kept)
    thinned = dataclasses.replace(family, reduced_design=reduced)
    return dataclasses.replace(settings, families={**settings.families, EMBEDDED: thinned})


@pytest.mark.parametrize("kept", [{"d3": (1,)}, {"d3": (2, 3)}, {"d1": (3,), "d3": (1, 2)}])
def test_a_thinned_depth_keeps_4_3s_option_balance_and_the_accounting_closes(settings, bank, kept):
    thinned = _thinned(settings, kept)
    grid = build_grid(thinned, bank, EMBEDDED)
    per_rotation = grid[grid.block_kind != "binding"]  # binding: 40 registered documents, its own deal (4.2)
    for depth, rotations in kept.items():
        assert set(per_rotation.loc[per_rotation.depth == depth, "rotation"]) == set(rotations), depth
    full = per_rotation[~per_rotation.depth.isin(list(kept))]
    assert set(full.rotation) == set(settings.rotations)
    for block in ("pilot_primary", "pilot_probe_other_option", "primary"):
        rows = grid[grid.block == block]
        # 4.3: within every cell and depth each option is shown equally often (3 of 6 unthinned).
        shown = rows.groupby(["item_id", "cell_index", "depth_index"]).content_option.agg(
            lambda s: ((s == 1).sum(), (s == 2).sum()))
        assert all(a == b > 0 for a, b in shown), (block, shown[[a != b for a, b in shown]])
        # The option is still not a function of order and depth across the cells of a unit.
        assert (rows.groupby(["item_id", "rotation", "order", "depth_index"]).content_option.nunique() == 2).all()
    # The accounting counts each depth at its own rotations and says which depth is thinned.
    selection = registered_selection(thinned, bank, thinned.family(EMBEDDED))
    accounting = trial_accounting(thinned, EMBEDDED, selection, mask(grid, assignment_key(thinned, EMBEDDED)))
    assert (accounting.status != "MISMATCH").all(), accounting[accounting.status == "MISMATCH"]
    primary = accounting.set_index("block").loc["pilot_primary"]
    n_rot = sum(len(kept.get(f"d{d}", settings.rotations)) for d in (1, 2, 3))
    assert primary.expected_rows == primary.actual_rows == 1 * 6 * n_rot * 2
    assert "reduced design" in primary.formula and all(d in primary.formula for d in kept)
    # A thinned table that lost one of its documents is caught.
    broken = mask(grid, assignment_key(thinned, EMBEDDED)).iloc[1:]
    assert (trial_accounting(thinned, EMBEDDED, selection, broken).status == "MISMATCH").any()


def test_a_depth_thinned_to_one_rotation_orders_rows_as_the_full_design_does(settings, bank):
    """Thinning drops rows and reorders none: the unthinned depths' rows are the full design's."""
    full = build_grid(_thinned(settings, {}), bank, EMBEDDED)
    thinned = build_grid(_thinned(settings, {"d3": (1,)}), bank, EMBEDDED)
    keep = (full.depth != "d3") | (full.rotation == 1) | (full.block_kind == "binding")
    pd.testing.assert_frame_equal(full[keep].reset_index(drop=True), thinned)


def test_the_power_simulation_simulates_a_thinned_depth_as_the_family_builds_it(settings, bank):
    """6.3 simulates the design the family runs: a reduced design's thinned depth has the same
    rotation x order x depth x cell combinations in the simulated design as in the trial table."""
    from fear_assets.simulation.design import simulated_design

    thinned = _thinned(settings, {"d3": (1,)})
    family = thinned.family(EMBEDDED)
    rotations_at = {i: family.rotations_at(i, thinned.rotations) for i in range(1, family.deepest_index + 1)}
    design = simulated_design(thinned, family.depth_keys, ["d2", "d3"], 5, (0.2, 0.2), seed=1,
                              rotations_at=rotations_at)
    combos = ["rotation", "order", "depth", "agent", "content", "option"]
    simulated = design.table[design.table.frame == "S001"][combos]
    grid = build_grid(thinned, bank, EMBEDDED)
    built = grid[grid.block == "pilot_primary"].rename(columns={"content_option": "option"})[combos]
    key = lambda t: sorted(map(tuple, t.astype(str).to_numpy()))  # noqa: E731
    assert key(simulated) == key(built)
    assert set(design.addressee.table.loc[design.addressee.table.depth == "d3", "rotation"]) == {1}
    # Unthinned, every depth has every rotation (the registered families' simulation is unchanged).
    full = simulated_design(thinned, family.depth_keys, ["d2", "d3"], 5, (0.2, 0.2), seed=1)
    assert len(full.table) == len(design.table) * 9 // 7 and set(full.table.rotation) == {1, 2, 3}
