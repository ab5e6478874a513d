"""Each asset shows exactly the partitions the registered design (and the registered simulation)
will run: no depth outside a family's design, no other family's simulation batches, and every
cross-partition input reads its own family's partitions only."""

import dagster as dg
import pytest

from fear_assets.defs.definitions import build_definitions, partitioning_of
from fear_assets.defs.main import family_partition_keys
from fear_assets.defs.modes import check_family
from fear_assets.defs.metadata import partition_metadata
from fear_assets.defs.partitions import (family_depth_partitions, partition_key, partition_parts, power_partitions,
                                         split_partition_key)
from fear_assets.simulation.batches import batch_keys_of

from fear_assets_tests.conftest import EMBEDDED

REGISTERED = "qwen2.5-7b"


@pytest.fixture(scope="module")
def graph():
    return build_definitions().resolve_asset_graph()


def _partitions_of(graph, name: str) -> set[str]:
    return set(graph.get(dg.AssetKey(name)).partitions_def.get_partition_keys())


def test_the_embedded_family_has_no_partition_outside_its_design_and_a_registered_family_has_all(graph, settings):
    for name in ("pilot_trial_table", "pilot_scores", "assignment_key", "confirmatory_scores"):
        keys = _partitions_of(graph, name)
        for family in settings.families:
            depths = settings.family(family).depth_keys
            assert {k for k in keys if split_partition_key(k).family == family} == \
                {f"{d}|{family}" for d in depths}, (name, family)
        outside = f"d{len(settings.family(EMBEDDED).depth_keys) + 1}|{EMBEDDED}"
        assert outside not in keys and "d8|qwen2.5-7b" in keys
    assert len(settings.family(EMBEDDED).depth_keys) < len(settings.family(REGISTERED).depth_keys)


def test_power_simulation_has_exactly_each_familys_registered_batches(graph, settings):
    keys = _partitions_of(graph, "power_simulation")
    assert keys == {f"{b}|{f}" for f in settings.families for b in batch_keys_of(settings, f)}
    # the demo family's are the batches the demo runs: all of them fill after a demo main job
    demo = family_partition_keys(settings, EMBEDDED)["by_batch"]
    assert {k for k in keys if k.endswith(f"|{EMBEDDED}")} == set(demo) and len(demo) == len(
        batch_keys_of(settings, EMBEDDED))
    assert partitioning_of(graph.assets_def_for_key(dg.AssetKey("power_simulation"))) == "by_batch"
    assert partitioning_of(graph.assets_def_for_key(dg.AssetKey("pilot_scores"))) == "by_depth"


def test_every_cross_partition_input_reads_its_own_family_and_all_of_it(graph, settings):
    """A per-family asset reads all depths (or batches) of its family and only them; a family x
    depth asset reads its family's partition of a per-family input."""
    checked = 0
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        for parent in node.parent_keys:
            down, up = node.partitions_def, graph.get(parent).partitions_def
            if down is None or up is None or down == up:
                continue
            mapping = graph.get_partition_mapping(key, parent)
            for k in down.get_partition_keys():
                if not (k.endswith(f"|{EMBEDDED}") or k in (EMBEDDED, REGISTERED) or k.endswith(f"|{REGISTERED}")):
                    continue
                family = split_partition_key(k).family
                got = set(mapping.get_upstream_mapped_partitions_result_for_partitions(
                    down.subset_with_partition_keys([k]), down, up).partitions_subset.get_partition_keys())
                want = {u for u in up.get_partition_keys() if split_partition_key(u).family == family}
                if split_partition_key(k).part is not None:  # a family x depth/batch step: its family
                    want = {family}
                assert got == want, (key.to_user_string(), parent.to_user_string(), k)
                checked += 1
    assert checked > 20


def test_the_family_and_partition_are_read_from_the_key(settings):
    key = partition_key(EMBEDDED, "d2")
    assert key == "d2|smollm2-135m" and key in family_depth_partitions.get_partition_keys()
    context = dg.build_asset_context(partition_key=key)
    assert partition_parts(context) == (EMBEDDED, "d2")
    assert partition_metadata(context) == {"family": EMBEDDED, "partition": key}
    assert check_family(context) == EMBEDDED  # a gate's page names the family of its partition
    batch = f"{batch_keys_of(settings, EMBEDDED)[0]}|{EMBEDDED}"
    assert batch in power_partitions.get_partition_keys()
    assert check_family(dg.build_asset_context(partition_key=batch)) == EMBEDDED
    assert check_family(dg.build_asset_context(partition_key=REGISTERED)) == REGISTERED
    assert split_partition_key(batch) == (EMBEDDED, batch_keys_of(settings, EMBEDDED)[0])
    assert split_partition_key(EMBEDDED) == (EMBEDDED, None)
    with pytest.raises(ValueError, match="not '<family>'"):
        split_partition_key("|smollm2-135m")
