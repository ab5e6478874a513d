"""Through Dagster: a real instance, a real DuckDB file, the registered assets and checks."""

import json

import dagster as dg
import duckdb
import pandas as pd
import pytest
import yaml

from fear_assets.defs.definitions import all_assets, all_checks, resources
from fear_assets.defs.partitions import (FAMILY_DEPTH_EXPR, FAMILY_EXPR, family_depth_partitions, family_partitions,
                                         partition_key, registered_partition_keys)
from fear_assets.registration.freeze import freeze_record, write_record
from fear_assets.defs.resources.store import SCHEMA, duckdb_io_manager
from fear_assets.stimuli.bank import load_bank

from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.issued import register

EVERYTHING = [*all_assets, *all_checks]


@pytest.fixture
def env(tmp_path, settings):
    """A temporary DuckDB file, Dagster instance and tokenizer cache."""
    instance = dg.DagsterInstance.ephemeral()
    db = str(tmp_path / "store.duckdb")
    res = resources(db, cache_dir=str(tmp_path / "cache"))
    return instance, db, res


def _run(env, selection, partition_key=None, raise_on_error=True, res=None):
    instance, _, default_res = env
    return dg.materialize(EVERYTHING, selection=selection, partition_key=partition_key, instance=instance,
                          resources=res or default_res, raise_on_error=raise_on_error)


def _rows(db, table, where="true"):
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(f"select count(*) from {SCHEMA}.{table} where {where}").fetchone()[0]


def test_definitions_load_and_checks_are_blocking():
    from fear_assets.defs.definitions import defs

    defs.resolve_all_job_defs()
    gates = {"five_single_token_names", "matches_registration_record", "controls_at_chance", "pilot_probe_rules",
             "tokenizer_agreement",  # 4.2's tokenizer agreement on model_manifest
             "h4_converged", "pilot_controls_at_chance", "matching_gate", "zero_preference_gate", "binding_gate", "scorer_agreement",
             "positive_controls_pass", "registration_gates", "posteriors_converged",
             "power_targets_met"}  # 6.3's power gate (issue 11)
    assert {c.check_key.name for c in all_checks} == {"bank_freeze", "accounting_closed", *gates}
    integrity = [c for c in all_checks if c.check_key.name in ("bank_freeze", "accounting_closed")]
    assert all(spec.blocking for c in integrity for spec in c.check_specs)
    # Every registration gate is a blocking check: Dagster fixes the flag when the definitions
    # load, and the family's mode decides at run time whether a failure blocks (its severity:
    # ERROR once the family's record is issued, WARN in pilot mode, which records the failure
    # and lets downstream run). The H4 flags and the control probes never block.
    flags = {"controls_at_chance", "h4_converged", "pilot_controls_at_chance"}
    gate_checks = [c for c in all_checks if c.check_key.name in gates - flags]
    assert all(spec.blocking for c in gate_checks for spec in c.check_specs)
    assert all(spec.description.startswith("Registration gate (blocking after registration; advisory in pilot mode)")
               for c in gate_checks for spec in c.check_specs)
    assert not any(spec.blocking for c in all_checks if c.check_key.name in flags for spec in c.check_specs)


def test_partition_materialises_once_and_rematerialises_in_place(env, settings):
    _, db, _ = env
    first = _run(env, ["frame_bank"])
    assert all(e.passed for e in first.get_asset_check_evaluations())
    _run(env, ["name_gate"], EMBEDDED)
    key = registered_partition_keys(settings, EMBEDDED)[1]  # d2
    _run(env, ["pilot_trial_table", "assignment_key"], key)
    n = _rows(db, "pilot_trial_table", "family = 'smollm2-135m' and depth = 'd2'")
    assert n > 0
    with duckdb.connect(db, read_only=True) as con:
        before = con.execute(f"select trial_id, document_sha256 from {SCHEMA}.pilot_trial_table order by trial_id").df()
    _run(env, ["pilot_trial_table", "assignment_key"], key)
    assert _rows(db, "pilot_trial_table") == n  # exactly one copy
    with duckdb.connect(db, read_only=True) as con:
        after = con.execute(f"select trial_id, document_sha256 from {SCHEMA}.pilot_trial_table order by trial_id").df()
    pd.testing.assert_frame_equal(before, after)
    # A second partition adds its own rows and leaves the first alone.
    _run(env, ["pilot_trial_table", "assignment_key"], registered_partition_keys(settings, EMBEDDED)[0])
    assert _rows(db, "pilot_trial_table", "depth = 'd2'") == n
    assert _rows(db, "pilot_trial_table", "depth = 'd1'") > 0


def _store_record(env, status: str, replacements: dict) -> None:
    """A registration record in the store, as ``registration_record`` writes it (issue 12:
    the confirmatory trial table reads the record as an asset input, never from disk)."""
    instance, db, _ = env

    @dg.asset(name="registration_record", partitions_def=family_partitions, metadata=FAMILY_EXPR)
    def stored_record():
        record = {"family": EMBEDDED, "status": status, "replacements": replacements}
        return pd.DataFrame([{"family": EMBEDDED, "gate": "frame_selection (4.3)", "passed": True, "numbers": "{}",
                              "message": "", "record_json": json.dumps(record), "record_path": ""}])

    dg.materialize([stored_record], partition_key=EMBEDDED, instance=instance,
                   resources={"io_manager": duckdb_io_manager(db)})


def test_accounting_through_dagster_is_closed_for_all_depths(env, settings):
    _, db, _ = env
    _run(env, ["frame_bank"])
    _run(env, ["name_gate"], EMBEDDED)
    _store_record(env, "draft", {})
    for key in registered_partition_keys(settings, EMBEDDED):
        _run(env, ["pilot_trial_table", "confirmatory_trial_table", "assignment_key"], key)
    result = _run(env, ["trial_accounting"], EMBEDDED)
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed, evaluation.description
    assert _rows(db, "trial_accounting", "block = 'TOTAL' and status = 'ok'") == 1
    # The pilot and the confirmatory tables split the blocks between them.
    assert _rows(db, "pilot_trial_table", "block not like 'pilot_%'") == 0
    assert _rows(db, "confirmatory_trial_table", "block like 'pilot_%'") == 0
    assert _rows(db, "confirmatory_trial_table") > 0


def test_a_registered_replacement_reaches_the_confirmatory_table_through_the_record(env, settings, bank):
    """4.3: a registered record's replacement (failing frame -> reserve) is built into the
    confirmatory design from the record asset; a draft record changes nothing."""
    _, db, _ = env
    _run(env, ["frame_bank"])
    _run(env, ["name_gate"], EMBEDDED)
    key = registered_partition_keys(settings, EMBEDDED)[0]
    _store_record(env, "draft", {})
    _run(env, ["confirmatory_trial_table"], key)
    with duckdb.connect(db, read_only=True) as con:
        frames = {r[0] for r in con.execute(f"select distinct item_id from {SCHEMA}.confirmatory_trial_table "
                                            "where frame_set = 'confirmatory'").fetchall()}
    failing = sorted(frames)[0]
    reserve = bank.frames_of(bank.item(failing).group, "reserve")[0].id
    _store_record(env, "registered", {failing: reserve})
    _run(env, ["confirmatory_trial_table"], key)
    with duckdb.connect(db, read_only=True) as con:
        after = {r[0] for r in con.execute(f"select distinct item_id from {SCHEMA}.confirmatory_trial_table "
                                           "where frame_set = 'confirmatory'").fetchall()}
    assert failing not in after and reserve in after and len(after) == len(frames)


def test_a_depth_outside_the_embedded_design_is_no_partition_and_cannot_be_run(env):
    # A depth the family's design lacks must not look like a scored partition: it is no
    # partition at all, so a run of it is refused and nothing is stored (it used to be an
    # empty "not applicable" slice that showed as green as a scored one).
    _, db, _ = env
    _run(env, ["frame_bank"])
    _run(env, ["name_gate"], EMBEDDED)
    outside = partition_key(EMBEDDED, "d7")
    assert outside not in family_depth_partitions.get_partition_keys()
    with pytest.raises(dg.DagsterUnknownPartitionError, match="d7"):
        _run(env, ["pilot_trial_table", "assignment_key"], outside)
    with duckdb.connect(db, read_only=True) as con:
        tables = {r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()}
    assert "pilot_trial_table" not in tables and "assignment_key" not in tables


def test_a_failed_write_keeps_the_old_rows(env, settings):
    _, db, res = env
    _run(env, ["frame_bank"])
    _run(env, ["name_gate"], EMBEDDED)
    key = registered_partition_keys(settings, EMBEDDED)[0]
    _run(env, ["pilot_trial_table"], key)
    n = _rows(db, "pilot_trial_table")

    @dg.asset(name="pilot_trial_table", partitions_def=family_depth_partitions, metadata=FAMILY_DEPTH_EXPR)
    def broken_trial_table():
        # Right partition columns, wrong schema: the insert fails after the delete ran.
        return pd.DataFrame({"family": [EMBEDDED], "depth": ["d1"], "unexpected": [1]})

    result = dg.materialize([broken_trial_table], partition_key=key, resources={"io_manager": duckdb_io_manager(db)},
                            raise_on_error=False)
    assert not result.success
    assert _rows(db, "pilot_trial_table") == n  # the transaction rolled back: nothing lost


def test_freeze_check_fails_on_a_one_character_edit_and_blocks_downstream(env, tmp_path, settings, bank_copy):
    _, db, _ = env
    registration = tmp_path / "registration"
    write_record(freeze_record(settings, load_bank(bank_copy, settings)), registration)
    res = resources(db, bank_dir=str(bank_copy), registration_dir=str(registration), cache_dir=str(tmp_path / "c"))
    d1 = partition_key(EMBEDDED, "d1")
    ok = _run(env, ["frame_bank", "assignment_key"], d1, res=res)
    assert all(e.passed for e in ok.get_asset_check_evaluations())
    assert "assignment_key" in {e.asset_key.path[-1] for e in ok.get_asset_materialization_events()}

    path = bank_copy / "frames/isolation.yaml"
    text = path.read_text()
    at = text.index("{agent} will") + len("{agent} wil")
    path.write_text(text[:at] + "L" + text[at + 1:])  # one character: "will" -> "wilL"
    assert sum(a != b for a, b in zip(text, path.read_text())) == 1
    result = _run(env, ["frame_bank", "assignment_key"], d1, res=res, raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed
    assert "bank item:ISO-" in evaluation.description and "changed" in evaluation.description
    # The check is blocking: the downstream asset in the same run did not materialise.
    materialised = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert "assignment_key" not in materialised


def test_bad_bank_fails_the_asset_and_writes_nothing(env, tmp_path, settings, bank_copy):
    _, db, _ = env
    res = resources(db, bank_dir=str(bank_copy), cache_dir=str(tmp_path / "c"))
    _run(env, ["frame_bank"], res=res)
    before = _rows(db, "frame_bank")
    path = bank_copy / "frames/termination.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["frames"][0]["content_options"] = ["Monday"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = _run(env, ["frame_bank"], res=res, raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "TER-01" in str(failure.event_specific_data.error) and "content_options" in str(failure.event_specific_data.error)
    assert _rows(db, "frame_bank") == before


def test_a_failed_name_gate_blocks_downstream_in_confirmatory_mode_and_is_flagged_in_pilot_mode(env, tmp_path,
                                                                                             settings, bank):
    _, db, _ = env
    _run(env, ["frame_bank"])
    result = _run(env, ["name_gate"], EMBEDDED)
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and "registered order stand in" in check.description  # SmolLM2 splits every name
    key = registered_partition_keys(settings, EMBEDDED)[0]
    _run(env, ["pilot_trial_table"], key)
    with duckdb.connect(db, read_only=True) as con:
        flags = con.execute(f"select distinct name_gate_passed from {SCHEMA}.pilot_trial_table").fetchall()
    assert flags == [(False,)]
    # The family's record is issued (fear register): from then on its gates block.
    registration = tmp_path / "registration"
    register(registration, EMBEDDED, settings, bank)
    res = resources(db, registration_dir=str(registration), cache_dir=str(tmp_path / "c"))
    blocked = _run(env, ["pilot_trial_table"], key, raise_on_error=False, res=res)
    assert not blocked.success
    failure = [e for e in blocked.all_events if e.is_step_failure][0]
    assert "confirmatory mode" in str(failure.event_specific_data.error)
