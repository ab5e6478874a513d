"""The carriage probe and its controls on constructed features (protocol 4.5, 6.1)."""

import itertools

import numpy as np
import pandas as pd
import pytest

from fear_assets.probes.carriage import ProbeSettings, h4_interpretable, pilot_rules, run_fold, run_probes

CONFIG = ProbeSettings(inverse_regularisation=1.0, clip=(0.001, 0.999), interval=0.99, master_seed=7)


def _meta(frames=2, depths=3):
    rows = []
    for f, rot, order, depth, cell, option in itertools.product(range(frames), (1, 2, 3), (1, 2), range(1, depths + 1),
                                                                range(1, 7), (1, 2)):
        rows.append({"trial_id": f"F{f}|r{rot}|o{order}|d{depth}|c{cell}|v{option}", "item_id": f"F{f}",
                     "rotation": rot, "order": order, "depth_index": depth, "condition_code": f"C{cell}",
                     "content_option": option})
    return pd.DataFrame(rows)


def _features(meta, option_signal=0.0, nuisance=0.0, dim=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(len(meta), dim))
    X[:, 0] += option_signal * np.where(meta["content_option"] == 1, 1.0, -1.0)
    # Large offsets by depth and cell: position and cell identity, not content.
    offsets = {k: rng.normal(scale=nuisance, size=dim)
               for k in itertools.product(range(1, 4), [f"C{c}" for c in range(1, 7)], (1, 2))}
    X += np.stack([offsets[(d, c, o)] for d, c, o in meta[["depth_index", "condition_code", "order"]].itertuples(index=False)])
    return X


def test_a_feature_that_encodes_the_option_is_decoded():
    meta = _meta()
    outputs, controls = run_probes(_features(meta, option_signal=2.0), meta, CONFIG, n_jobs=1)
    probe = controls.set_index("probe").loc["probe"]
    assert probe.accuracy > 0.85 and probe.excludes_chance
    assert len(outputs) == len(meta)  # every document, both content versions, once held out
    assert outputs.p_correct.between(0.001, 0.999).all()
    assert np.allclose(outputs.log_odds, np.log(outputs.p_correct / (1 - outputs.p_correct)))
    assert h4_interpretable(controls)


def test_depth_and_cell_alone_are_not_decoded_after_residualisation():
    meta = _meta()
    outputs, controls = run_probes(_features(meta, option_signal=0.0, nuisance=5.0), meta, CONFIG, n_jobs=1)
    table = controls.set_index("probe")
    assert abs(table.loc["probe", "accuracy"] - 0.5) < 0.1 and not table.loc["probe", "excludes_chance"]
    for control in ("cell_order_depth", "order_depth", "depth", "shuffled_labels"):
        assert not table.loc[control, "excludes_chance"], control
    assert h4_interpretable(controls)


def test_a_frame_built_at_one_rotation_is_refused_with_the_fix_not_a_numpy_error():
    """4.5: each fold holds out one rotation and trains on the others. A frame whose documents
    sit at one rotation (a reduced design thinned to one) has no training fold; the first
    thinned rehearsal crashed inside numpy here."""
    meta = _meta(frames=1)
    meta = meta[meta["rotation"] == 2].reset_index(drop=True)
    with pytest.raises(ValueError, match=r"frame F0 has documents at rotation 2 only.*rotations_by_depth"):
        run_probes(_features(meta, option_signal=2.0), meta, CONFIG, n_jobs=1)
    two = _meta(frames=1)
    two = two[two["rotation"] != 1].reset_index(drop=True)
    outputs, _ = run_probes(_features(two, option_signal=2.0), two, CONFIG, n_jobs=1)
    assert set(outputs["fold_rotation"]) == {2, 3} and len(outputs) == len(two)


def test_a_training_fold_is_384_documents_for_a_registered_frame():
    meta = _meta(frames=1, depths=8)
    assert ((meta.rotation != 1).sum()) == 384


def test_residualisation_never_sees_the_held_out_fold():
    meta = _meta(frames=1)
    result = run_fold(_features(meta, option_signal=1.0), meta, held_out=2, config=CONFIG)
    held_out = set(meta.loc[meta.rotation == 2, "trial_id"])
    assert result["residualised_on"] and not (result["residualised_on"] & held_out)
    assert set(result["outputs"].trial_id) == held_out


def test_a_leaky_control_is_caught():
    # A control factor that carries the label (here: the cell identity when the option is a
    # function of the cell) must make H4 uninterpretable.
    meta = _meta()
    meta["content_option"] = np.where(meta["condition_code"].isin(["C1", "C3", "C5"]), 1, 2)
    _, controls = run_probes(_features(meta), meta, CONFIG, n_jobs=1)
    assert controls.set_index("probe").loc["cell_order_depth", "excludes_chance"]
    assert not h4_interpretable(controls)


def test_documents_without_the_agent_sentence_decode_at_chance():
    meta = _meta()
    X = _features(meta, option_signal=2.0)
    na = meta.drop_duplicates(["item_id", "rotation", "order", "depth_index", "condition_code"]).reset_index(drop=True)
    Xna = np.random.default_rng(3).normal(size=(len(na), X.shape[1]))
    _, controls = run_probes(X, meta, CONFIG, Xna, na, n_jobs=1)
    row = controls.set_index("probe").loc["no_agent_sentence"]
    assert row.n == len(na) and not row.excludes_chance


def test_pilot_rules_ceiling_and_shallowest_decoding():
    meta = _meta()
    outputs, _ = run_probes(_features(meta, option_signal=6.0), meta, CONFIG, n_jobs=1)
    rules = pilot_rules(outputs, shallowest=1, band=[2, 3], ceiling=0.95, level=0.99)
    assert rules["decodes_at_shallowest"] and rules["ceiling"] and rules["h4_estimation_only"]
    weak, _ = run_probes(_features(meta, option_signal=0.0), meta, CONFIG, n_jobs=1)
    rules = pilot_rules(weak, shallowest=1, band=[2, 3], ceiling=0.95, level=0.99)
    assert not rules["decodes_at_shallowest"] and not rules["ceiling"]


def test_probe_inputs_read_checksummed_feature_files_and_label_no_agent_documents(tmp_path):
    from fear_assets.probes.inputs import PROBE_BLOCKS, load_features, probe_inputs
    from fear_assets.core.hashing import sha256_file

    meta = _meta(frames=1)
    X = _features(meta, option_signal=1.0, dim=8)
    path = tmp_path / "d.npy"
    rows = []
    for i, r in enumerate(meta.itertuples()):
        cell = int(r.condition_code[1:])
        k = r.rotation + 3 * (r.order - 1)
        rule_option = 1 if (k + r.depth_index + cell) % 2 == 0 else 2  # the registered option rule
        block = "pilot_primary" if r.content_option == rule_option else "pilot_probe_other_option"
        rows.append({"trial_id": r.trial_id, "block": block, "item_id": r.item_id, "rotation": r.rotation,
                     "order": r.order, "depth": f"d{r.depth_index}", "condition_code": r.condition_code,
                     "content_option": r.content_option, "feature_row": i})
    units = meta.drop_duplicates(["rotation", "order", "depth_index"])
    for j, r in enumerate(units.itertuples()):
        rows.append({"trial_id": f"na{j}", "block": "pilot_probe_no_agent", "item_id": r.item_id,
                     "rotation": r.rotation, "order": r.order, "depth": f"d{r.depth_index}", "condition_code": "C0",
                     "content_option": 0, "feature_row": len(meta) + j})
    X_all = np.vstack([X, np.zeros((len(units), X.shape[1]), np.float32)]).astype(np.float32)
    np.save(path, X_all)
    # Both 4.8 exclusion flags, as the scoring stage writes them; one truncated answer, which
    # (issue 10) leaves its trial out of the probe like every other analysis.
    scores = pd.DataFrame(rows).assign(features_file=str(path), features_sha256=sha256_file(path),
                                       excluded_context=False, generation_truncated=False)
    scores.loc[0, "generation_truncated"] = True
    Xp, docs, Xna, na = probe_inputs(scores, PROBE_BLOCKS["pilot"])
    assert len(docs) == len(meta) - 1 and scores.trial_id[0] not in set(docs.trial_id)
    assert np.allclose(Xp, X_all[docs.feature_row.to_numpy()])
    # each no-agent document gets one label: the option its twin (lowest code, C1) shows
    assert len(na) == len(units) and set(na.content_option) == {1, 2} and Xna.shape == (len(na), X.shape[1])
    assert (na.twin_condition_code == "C1").all()
    k = na.rotation + 3 * (na.order - 1)
    assert (na.content_option == np.where((k + na.depth_index + 1) % 2 == 0, 1, 2)).all()
    np.save(path, X_all + 1)  # a changed file no longer matches its recorded checksum
    with pytest.raises(ValueError, match="sha256 differs"):
        load_features(scores)


# ---------------------------------------------------------------------------------------
# 4.5: the no-agent-sentence control is informative, so a leak into it must show
# ---------------------------------------------------------------------------------------
def _scores_with_no_agent(tmp_path, meta, X, no_agent_features):
    """A scores table as the scoring stage writes it: the agent documents (the option rule's
    version in pilot_primary, the other in pilot_probe_other_option) and one no-agent document
    per unit, whose features ``no_agent_features(unit rows of meta)`` gives."""
    from fear_assets.core.hashing import sha256_file

    rows = []
    for i, r in enumerate(meta.itertuples()):
        k = r.rotation + 3 * (r.order - 1)
        rule_option = 1 if (k + r.depth_index + int(r.condition_code[1:])) % 2 == 0 else 2  # the option rule
        rows.append({"trial_id": r.trial_id, "block": "pilot_primary" if r.content_option == rule_option
                     else "pilot_probe_other_option", "item_id": r.item_id, "rotation": r.rotation, "order": r.order,
                     "depth": f"d{r.depth_index}", "condition_code": r.condition_code,
                     "content_option": r.content_option, "feature_row": i})
    units = meta.drop_duplicates(["item_id", "rotation", "order", "depth_index"]).reset_index(drop=True)
    for j, r in enumerate(units.itertuples()):
        rows.append({"trial_id": f"na{j}", "block": "pilot_probe_no_agent", "item_id": r.item_id,
                     "rotation": r.rotation, "order": r.order, "depth": f"d{r.depth_index}", "condition_code": "C0",
                     "content_option": 0, "feature_row": len(meta) + j})
    path = tmp_path / "features.npy"
    np.save(path, np.vstack([X, no_agent_features(units)]).astype(np.float32))
    return pd.DataFrame(rows).assign(features_file=str(path), features_sha256=sha256_file(path),
                                     excluded_context=False, generation_truncated=False)


def _no_agent_control(tmp_path, meta, X, no_agent_features):
    from fear_assets.probes.inputs import PROBE_BLOCKS, probe_inputs

    Xp, docs, Xna, na = probe_inputs(_scores_with_no_agent(tmp_path, meta, X, no_agent_features),
                                     PROBE_BLOCKS["pilot"])
    _, controls = run_probes(Xp, docs, CONFIG, Xna, na, n_jobs=1)
    return controls.set_index("probe").loc["no_agent_sentence"], controls


@pytest.mark.parametrize("leaking_cell", ["C1", "C2"])
def test_a_pipeline_that_leaks_the_agent_option_into_no_agent_documents_is_caught(tmp_path, leaking_cell):
    """4.5: the no-agent-sentence probe is an informative control and "must decode at chance".
    If the no-agent documents' features are (a noisy copy of) an agent document of their unit
    -- a misaligned feature row, state carried over -- they encode that document's option and
    the control must leave chance, making H4 uninterpretable (6.1). Either parity of leaking
    cell is caught (the interval is two-sided)."""
    meta = _meta()
    X = _features(meta, option_signal=2.0)
    rng = np.random.default_rng(11)
    by_trial = dict(zip(meta["trial_id"], range(len(meta))))
    rule_docs = {}
    for r in meta.itertuples():
        k = r.rotation + 3 * (r.order - 1)
        if r.condition_code == leaking_cell and r.content_option == (1 if (k + r.depth_index + int(
                leaking_cell[1:])) % 2 == 0 else 2):
            rule_docs[(r.item_id, r.rotation, r.order, r.depth_index)] = by_trial[r.trial_id]

    def leaked(units):
        rows = [rule_docs[(u.item_id, u.rotation, u.order, u.depth_index)] for u in units.itertuples()]
        return X[rows] + rng.normal(scale=0.3, size=(len(units), X.shape[1]))

    row, controls = _no_agent_control(tmp_path, meta, X, leaked)
    assert row.n == meta.drop_duplicates(["item_id", "rotation", "order", "depth_index"]).shape[0]
    assert row.excludes_chance and abs(row.accuracy - 0.5) > 0.3
    assert not h4_interpretable(controls)


def test_clean_no_agent_documents_stay_at_chance(tmp_path):
    """The same pipeline with no-agent features that carry no option: at chance, H4 interpretable."""
    meta = _meta()
    X = _features(meta, option_signal=2.0)
    rng = np.random.default_rng(12)
    row, controls = _no_agent_control(tmp_path, meta, X, lambda units: rng.normal(size=(len(units), X.shape[1])))
    assert not row.excludes_chance
    assert h4_interpretable(controls)
