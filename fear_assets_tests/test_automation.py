"""Stage-to-stage automation and the model steps' retries (``fear_assets.defs.automation``).

"Automation, opt-in from the site configuration: a family's next stage is materialised when its
upstream assets are fresh and their blocking checks passed [...] and model steps carry a
RetryPolicy (resumable scoring makes a retry cost only the unfinished chunk)." Deterministic
input errors (the project's own ``FearAssetsError``) are not retried.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fear_assets.core.errors import DesignError, InputError
from fear_assets.core.site import SITE_ENV, SiteConfig
from fear_assets.defs.automation import (AUTOMATED_STAGES, REGISTERED_STAGES, LAUNCHED_BY_TAG, SENSOR_NAME, failure_text,
                                         model_retry_policy, model_step)
from fear_assets.defs.definitions import STAGE_NAMES, build_definitions, defs, stage_jobs
from fear_assets.defs.partitions import power_partition_keys, power_partitions

from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.issued import issued_protocol

ROOT = Path(__file__).resolve().parents[1]
OTHER = "qwen2.5-7b"


def _conditioned(d: dg.Definitions) -> dict[str, str]:
    graph = d.resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).automation_condition.get_label()
            for k in graph.get_all_asset_keys() if graph.get(k).automation_condition is not None}


def _gpu_keys(d: dg.Definitions) -> set[str]:
    return {k.to_user_string() for a in d.assets if a.op.pool == "gpu" for k in a.keys}


def test_automation_off_is_todays_definitions():
    """The default (no site file, the demo, the tests): no condition, no sensor; turning it on
    changes no asset or check key."""
    assert os.environ.get(SITE_ENV) is None, "the suite runs without a site configuration"
    assert _conditioned(defs) == {}
    assert not list(defs.sensors or [])
    on = build_definitions(":memory:", automation=True)
    off, on_graph = defs.resolve_asset_graph(), on.resolve_asset_graph()
    assert off.get_all_asset_keys() == on_graph.get_all_asset_keys()
    assert off.asset_check_keys == on_graph.asset_check_keys
    assert [s.name for s in on.sensors] == [SENSOR_NAME]


def test_every_model_step_has_the_retry_policy_and_the_no_retry_wrapper():
    gpu = [a for a in defs.assets if a.op.pool == "gpu"]
    assert {k.to_user_string() for a in gpu for k in a.keys} >= {"pilot_scores", "confirmatory_scores",
                                                                 "sentence_surprisal", "zero_preference"}
    for a in gpu:
        assert a.op.retry_policy is not None and a.op.retry_policy.max_retries == SiteConfig().retries, a.key
        assert getattr(a.op.compute_fn.decorated_fn, "model_step", False), f"{a.key}: not wrapped by model_step"
    # other steps (DuckDB writers, the power batches) are not retried: their failures are not transient
    assert all(a.op.retry_policy is None for a in defs.assets if a.op.pool != "gpu")


def _site_subprocess(tmp_path: Path, text: str) -> dict:
    site = tmp_path / "site.yaml"
    site.write_text(text, encoding="utf-8")
    code = (
        "import json, dagster as dg\n"
        "from dagster._core.definitions.dependency import NodeHandle\n"
        "from fear_assets.defs.definitions import defs\n"
        "g = defs.resolve_asset_graph()\n"
        "out = {'conditions': {k.to_user_string(): g.get(k).automation_condition.get_label()\n"
        "                      for k in g.get_all_asset_keys() if g.get(k).automation_condition is not None},\n"
        "       'groups': {k.to_user_string(): g.get(k).group_name for k in g.get_all_asset_keys()},\n"
        "       'sensors': {s.name: str(s.default_status) for s in defs.sensors}, 'retries': {}}\n"
        "gpu = {a.op.name for a in defs.assets if a.op.pool == 'gpu'}\n"
        "for job in [defs.resolve_implicit_global_asset_job_def()] + [defs.resolve_job_def(j.name) for j in defs.jobs]:\n"
        "    for name in job.graph.node_dict:\n"
        "        if name in gpu:\n"
        "            p = job.get_retry_policy_for_handle(NodeHandle(name, None))\n"
        "            out['retries'][job.name + ':' + name] = None if p is None else p.max_retries\n"
        "print('RESULT ' + json.dumps(out))\n")
    env = {**os.environ, SITE_ENV: str(site), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_site_with_automation_conditions_the_pilot_and_retries_model_steps_as_configured(tmp_path):
    """The definitions read $FEAR_ASSETS_SITE when they load (a subprocess, as the daemon's code
    server loads them): every pilot asset gets its condition, the stimuli none (the family's start
    is a launch), the sensor is on, and every model step of every job (the stage jobs and the asset
    job that automation launches) retries max_retries times."""
    out = _site_subprocess(tmp_path, "automation: true\nretries: 3\n")
    groups, conditions = out["groups"], out["conditions"]
    pilot = {k for k, g in groups.items() if g == "pilot"}
    registration = {k for k, g in groups.items() if g == "registration"}
    assert AUTOMATED_STAGES == ("pilot", "registration")
    registered_only = {k for k, label in conditions.items() if label == "next stage (registered family)"}
    assert {groups[k] for k in registered_only} == set(REGISTERED_STAGES)
    assert set(conditions) - registered_only == pilot | registration
    assert conditions["model_manifest"] == "stage entry"  # no upstream asset: the family's stimuli trigger it
    assert conditions["power_simulation"] == "next stage (own batches)"
    assert conditions["power_summary"] == "next stage (own batches done)"
    assert all(conditions[k] == "next stage" for k in (pilot | registration)
               - {"model_manifest", "power_simulation", "power_summary"})
    assert not {k for k, g in groups.items() if g == "stimuli"} & set(conditions)
    assert out["sensors"] == {SENSOR_NAME: str(dg.DefaultSensorStatus.RUNNING)}
    retries = out["retries"]
    assert {k.split(":")[0] for k in retries} >= {"__ASSET_JOB", "pilot_by_family_job", "pilot_by_depth_job",
                                                  "collection_by_depth_job"}
    assert {k.split(":")[1] for k in retries} == _gpu_keys(defs)
    assert set(retries.values()) == {3}, retries


# --- what the conditions request (Dagster's evaluator, tick by tick, no daemon) -----------------

@pytest.fixture
def automated_defs():
    return build_definitions(":memory:", automation=True)


def _materialised(instance, key: str, partition: str | None = None, checks: dict[str, bool] | None = None,
                  severity=dg.AssetCheckSeverity.ERROR) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))
    for name, passed in (checks or {}).items():
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(asset_key=dg.AssetKey(key), check_name=name,
                                                                    passed=passed, partition=partition,
                                                                    severity=severity))


def _requested(result) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for key in result._requested_partitions_by_asset_key:
        parts = result.get_requested_partitions(key)
        out[key.to_user_string()] = {str(p) for p in parts}
    return {k: v for k, v in out.items() if v}


def _families(requested: dict[str, set[str]]) -> set[str]:
    return {p.split("|")[-1] for parts in requested.values() for p in parts}


def test_materialising_a_familys_stimuli_requests_its_pilot_and_no_other_family(automated_defs):
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    assert first.total_requested == 0  # nothing exists: nothing can run
    _materialised(instance, "frame_bank", checks={"bank_freeze": True})
    _materialised(instance, "name_gate", EMBEDDED)
    second = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=first.cursor)
    requested = _requested(second)
    assert _families(requested) == {EMBEDDED}, requested  # the shared bank alone moves no other family
    assert {"model_manifest", "assignment_key", "pilot_trial_table", "zero_preference",
            "sentence_surprisal"} <= set(requested), requested
    assert all(groups == "pilot" for groups in
               (automated_defs.resolve_asset_graph().get(dg.AssetKey(k)).group_name for k in requested))
    # the requests are handled: the next tick requests nothing again (no relaunch loop)
    third = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=second.cursor)
    assert third.total_requested == 0


def test_a_failed_blocking_check_stops_what_depends_on_it(automated_defs):
    """bank_freeze is blocking: with it failed, nothing built from the bank is requested, while
    what reads only the family's names still is."""
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    _materialised(instance, "frame_bank", checks={"bank_freeze": False})
    _materialised(instance, "name_gate", EMBEDDED)
    requested = _requested(dg.evaluate_automation_conditions(defs=automated_defs, instance=instance,
                                                             cursor=first.cursor))
    assert not {"assignment_key", "pilot_trial_table", "sentence_surprisal"} & set(requested), requested
    assert "zero_preference" in requested and "model_manifest" in requested


@pytest.mark.parametrize("severity", [dg.AssetCheckSeverity.WARN, dg.AssetCheckSeverity.ERROR])
def test_a_familys_failed_gate_stops_only_that_family_and_only_when_it_blocks(automated_defs, severity):
    """A registration gate blocks by its family's mode: a pilot family's failed gate is a WARN
    (advisory: its pilot goes on), a registered family's an ERROR (what depends on it waits);
    another family's failed gate never stops this one."""
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    _materialised(instance, "frame_bank", checks={"bank_freeze": True})
    _materialised(instance, "name_gate", EMBEDDED, checks={"five_single_token_names": True})
    _materialised(instance, "name_gate", OTHER, checks={"five_single_token_names": False}, severity=severity)
    requested = _requested(dg.evaluate_automation_conditions(defs=automated_defs, instance=instance,
                                                             cursor=first.cursor))
    family_of = {k: {p.split("|")[-1] for p in parts} for k, parts in requested.items()}
    assert EMBEDDED in family_of["pilot_trial_table"] and EMBEDDED in family_of["zero_preference"]
    stopped = severity == dg.AssetCheckSeverity.ERROR
    assert (OTHER in family_of["pilot_trial_table"]) is not stopped
    assert (OTHER in family_of["zero_preference"]) is not stopped
    assert OTHER in family_of["assignment_key"]  # it reads no name: the name gate does not stop it


def test_another_familys_stimuli_start_only_that_family(automated_defs):
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    _materialised(instance, "frame_bank", checks={"bank_freeze": True})
    _materialised(instance, "name_gate", OTHER)
    requested = _requested(dg.evaluate_automation_conditions(defs=automated_defs, instance=instance,
                                                             cursor=first.cursor))
    assert _families(requested) == {OTHER}, requested


def test_after_registration_only_a_registered_familys_stages_follow(tmp_path):
    """Collection onward follows on its own only for a family whose record is issued: a pilot
    family's draft record moves nothing after registration (collecting confirmatory data before
    registration is what the protocol forbids); issuing the record and re-materialising it (what
    ``fear register`` does) requests that family's collection and no other family's. The
    cross-family assets stay launched by hand. Issuing itself is never automated."""
    automated_defs = build_definitions(":memory:", automation=True, registration_dir=str(tmp_path))
    conditioned = _conditioned(automated_defs)
    graph = automated_defs.resolve_asset_graph()
    later = {k.to_user_string(): graph.get(k) for k in graph.get_all_asset_keys()
             if STAGE_NAMES.index(graph.get(k).group_name) > STAGE_NAMES.index("registration")}
    assert {"confirmatory_trial_table", "confirmatory_scores", "section8_reading"} <= set(conditioned)
    for name, node in later.items():
        if node.partitions_def is None:
            assert name not in conditioned, name
        else:
            assert conditioned[name] == "next stage (registered family)", name
    assert {"power_simulation", "power_summary", "registration_record"} <= set(conditioned)
    assert len(stage_jobs()) == len(automated_defs.jobs)

    instance = dg.DagsterInstance.ephemeral()
    tick = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    _materialised(instance, "frame_bank", checks={"bank_freeze": True})
    for family in (EMBEDDED, OTHER):
        _materialised(instance, "name_gate", family)
        _materialised(instance, "registration_record", family)  # both drafts
    tick = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=tick.cursor)
    assert not set(_requested(tick)) & set(later), _requested(tick)  # drafts: nothing after registration

    issued_protocol(tmp_path, OTHER)
    _materialised(instance, "registration_record", OTHER)  # fear register re-materialises the record
    tick = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=tick.cursor)
    requested = _requested(tick)
    assert "confirmatory_trial_table" in requested, requested
    assert _families({k: v for k, v in requested.items() if k in later}) == {OTHER}, requested


def test_the_power_simulation_runs_only_the_familys_own_batches_and_then_its_summary(automated_defs, settings):
    """The family x batch rectangle holds every family's batch keys; the family's estimates
    request only its own batches, and the summary follows once those exist."""
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance)
    _materialised(instance, "name_gate", EMBEDDED)
    _materialised(instance, "power_pilot_estimates", EMBEDDED)
    second = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=first.cursor)
    own = {str(k) for k in power_partition_keys(settings, EMBEDDED)}
    all_keys = {str(k) for k in power_partitions.get_partition_keys()}
    assert len(all_keys) > len(own) > 0
    assert _requested(second)["power_simulation"] == own
    assert "power_summary" not in _requested(second)  # its batches are not done
    for key in own:
        _materialised(instance, "power_simulation", key)
    third = dg.evaluate_automation_conditions(defs=automated_defs, instance=instance, cursor=second.cursor)
    assert _requested(third).get("power_summary") == {EMBEDDED}  # the other families' keys are not waited for


# --- retries: a tiny model step with the same wrapper -------------------------------------------

ATTEMPTS: list[str] = []


def _tiny_step(error: Exception, generator: bool):
    @dg.asset(name="tiny_model_step", pool="gpu", retry_policy=model_retry_policy(SiteConfig(retries=2), delay=0))
    @model_step
    def plain(context: dg.AssetExecutionContext) -> int:
        ATTEMPTS.append(context.run_id)
        raise error

    @dg.asset(name="tiny_model_step", pool="gpu", retry_policy=model_retry_policy(SiteConfig(retries=2), delay=0))
    @model_step
    def steps(context: dg.AssetExecutionContext):
        ATTEMPTS.append(context.run_id)
        raise error
        yield dg.Output(1)  # a generator step, as the scoring assets are

    return steps if generator else plain


def _failure(result) -> str:
    failures = [e for e in result.all_events if e.is_step_failure]
    assert len(failures) == 1
    return failure_text(failures[0].event_specific_data.error)


@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("error", [InputError("data/protocol_settings.yaml", "models", "dtype", "unknown dtype 'f8'",
                                              "write bfloat16 or float32"),
                                   DesignError("too few frames for the design")])
def test_a_projects_own_error_in_a_model_step_is_not_retried(error, generator):
    ATTEMPTS.clear()
    result = dg.materialize([_tiny_step(error, generator)], raise_on_error=False)
    assert not result.success
    assert len(ATTEMPTS) == 1, "a deterministic input error was retried"
    text = _failure(result)
    assert str(error) in text and text.count(str(error)) == 1  # the message reaches the user intact, once


@pytest.mark.parametrize("generator", [False, True])
def test_a_transient_error_in_a_model_step_is_retried(generator):
    ATTEMPTS.clear()
    result = dg.materialize([_tiny_step(RuntimeError("CUDA error: an illegal memory access"), generator)],
                            raise_on_error=False)
    assert not result.success
    assert len(ATTEMPTS) == 3, "max_retries=2: three attempts"
    text = _failure(result)
    assert "Exceeded max_retries of 2" in text and "CUDA error: an illegal memory access" in text


def test_the_retry_policy_backs_off_exponentially_with_jitter():
    policy = model_retry_policy(SiteConfig(retries=4))
    assert policy.max_retries == 4 and policy.backoff == dg.Backoff.EXPONENTIAL and policy.jitter == dg.Jitter.PLUS_MINUS
    assert model_retry_policy(SiteConfig(retries=0)).max_retries == 0


def test_launched_runs_say_they_came_from_automation(automated_defs):
    sensor = next(iter(automated_defs.sensors))
    assert sensor.run_tags.get(LAUNCHED_BY_TAG) == "automation"
