"""What runs without a hand: the daemon's stage-to-stage automation and the model steps' retries.

Both come from the site configuration (``core.site``: ``$FEAR_ASSETS_SITE``, read once when the
definitions load, like the settings), never from the registered settings: how a host schedules
and retries its steps decides no document, score, gate or reading.

Automation (``automation: true``; off by default, so the demo and the tests see today's
definitions). Every asset of an automated stage gets one declarative condition: a family x
partition is materialised when its upstream partitions are fresh (newly updated, none missing
or in progress: ``AutomationCondition.eager()``) and no blocking check of its inputs stopped the
family (``GatesClear``: Dagster's ``all_deps_blocking_checks_passed()`` reads a check's latest
evaluation whichever family ran it, and counts a pilot family's advisory WARN as a stop; the
gates' blocking is the family's mode, an ERROR), once the family's own stimuli exist (its ``name_gate``
partition): the shared frame bank alone moves no family, so a lab starts a family by
materialising that family's stimuli, and the daemon (``dagster dev`` / ``fear ui`` starts it)
carries it on. The pilot's one asset with no upstream asset, ``model_manifest``, takes the
family's stimuli as its trigger (it hashes the checkpoint files the pilot loads next). The
sensor submits one run per partition (no backfill), each tagged ``fear_assets/launched_by:
automation`` besides Dagster's own ``dagster/from_automation_condition``. As with any eager
condition, an update is an update: re-materialising a family's stimuli re-runs its pilot, and
on the daemon's first evaluation a missing pilot partition whose inputs exist is requested.

Which stages are automated (``AUTOMATED_STAGES``): the pilot and the registration stage, up to
the draft registration record.
- The power simulation is, for each family's own batches only: its partitions are each
  family's own batch keys (``partitions.power_partition_keys``) and the power summary reads
  its family's batches alone (``partitions.all_batches_of_family``); ``OwnBatches`` keeps
  both conditions to a family's own batches should the partitions ever hold more. ``OwnBatches`` and ``GatesClear`` are project code, so the sensor is evaluated
  in the code server (``use_user_code_server``), not in the daemon.
- The registration record is automated as the draft the pilot mode writes; issuing it is the
  deliberate human act ``fear register``.
- Collection and everything after it (``REGISTERED_STAGES``) follow on their own only for a
  family whose record is issued (``FamilyRegistered``, read from the registration directory at
  each evaluation): a pilot family's draft record moves nothing after registration, since
  collecting confirmatory data before registration is what the protocol forbids. Issuing the
  record (``fear register``) re-materialises the family's ``registration_record``, which is the
  update the collection's eager condition sees; the cross-family assets (no family partition)
  stay launched by hand.

Retries: every model step (pool "gpu") carries ``MODEL_RETRY`` (``retries`` from the site,
exponential backoff with jitter); scoring resumes from its finished chunks, so a retry costs
only the unfinished chunk. ``model_step`` turns the project's own errors
(``core.errors.FearAssetsError``: a malformed input, a missing checkpoint, a manifest that
differs) into a ``dg.Failure`` that is not retried: the same input fails the same way again.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import dagster as dg

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.settings import DEFAULT_REGISTRATION_DIR
from fear_assets.core.site import SiteConfig, load_site
from fear_assets.defs.instance import check_evaluations
from fear_assets.defs.partitions import DEFINITION_SETTINGS, LAYOUT, family_of_key, power_partition_keys
from fear_assets.registration.issue import CONFIRMATORY, family_mode

#: The site configuration the definitions are built from ($FEAR_ASSETS_SITE; none: defaults).
DEFINITION_SITE = load_site()

#: Stages whose assets the daemon materialises when automation is on (see the module docstring).
AUTOMATED_STAGES = ("pilot", "registration")
#: Stages the daemon materialises for a registered family only (``FamilyRegistered``).
REGISTERED_STAGES = ("collection", "probes", "analysis", "reading")
#: The family x batch asset (each family's own simulation batches).
POWER_BATCHES = dg.AssetKey("power_simulation")
#: Each family's own simulation batches ("<batch>|<family>"), from the settings the definitions load.
OWN_BATCHES = frozenset(str(k) for family in LAYOUT.families for k in power_partition_keys(DEFINITION_SETTINGS, family))
#: The family's stimuli: a family enters automation once this partition of it exists.
FAMILY_ENTRY = dg.AssetKey("name_gate")
#: The automation sensor (run by the daemon; on whenever automation is configured).
SENSOR_NAME = "fear_assets_automation"
#: Seconds between two evaluations of the conditions (Dagster's default).
SENSOR_INTERVAL_SECONDS = 30
#: Tag on every run the automation launches (besides Dagster's own dagster/from_automation_condition).
LAUNCHED_BY_TAG = "fear_assets/launched_by"
#: First retry's delay; doubled per attempt, with jitter, so a transient fault (a GPU reset, an
#: out-of-memory from a neighbour) has time to clear.
RETRY_DELAY_SECONDS = 30.0

AC = dg.AutomationCondition


def _family(partition_key: str | None) -> str | None:
    """The family part of a partition key ("<family>", "<depth>|<family>", "<batch>|<family>")."""
    return family_of_key(partition_key) if partition_key else None


def _families_kept(context, keep: Callable[[str | None], bool]) -> dg.AutomationResult:
    """The candidate partitions whose family (read from the key) ``keep`` accepts."""
    candidates = context.candidate_subset
    keys = {k for k in candidates.expensively_compute_partition_keys() if keep(_family(k))}
    return dg.AutomationResult(context=context, true_subset=context.asset_graph_view.
                               compute_intersection_with_partition_keys(keys, candidates))


class GatesClear(dg.AutomationCondition):
    """True for a partition unless, for its family, the latest evaluation of a blocking check of
    one of its inputs failed with ERROR severity: what Dagster itself stops a run at (the freeze
    gate; a registration gate of a registered family). A pilot family's failed gate is a WARN
    and does not stop it, and one family's gates never stop another family: the checks'
    evaluations are not partitioned, so the family is read from the run that evaluated them.
    ``inputs`` replaces the asset's own inputs (the stage's entry reads the family's stimuli)."""

    def __init__(self, inputs: tuple[dg.AssetKey, ...] | None = None):
        self._inputs = inputs

    @property
    def name(self) -> str:
        return "gates_clear"

    @property
    def description(self) -> str:
        return "no blocking check of an input failed with ERROR severity for the family"

    def evaluate(self, context) -> dg.AutomationResult:
        graph, instance = context.asset_graph, context.asset_graph_view.instance
        inputs = self._inputs if self._inputs is not None else graph.get(context.key).parent_keys
        stopped: set[str | None] = set()  # None: an unpartitioned input's gate stops every family
        for check in graph.get_check_keys_for_assets(set(inputs)):
            if not graph.get(check).blocking:
                continue
            seen: set[str | None] = set()
            for partition, evaluation in check_evaluations(instance, check, limit=200):  # newest first
                family = _family(partition)
                if family in seen:
                    continue  # an older evaluation of a family already decided
                seen.add(family)
                if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR:
                    stopped.add(family)
        if None in stopped or not stopped:
            return dg.AutomationResult(context=context, true_subset=context.get_empty_subset() if None in stopped
                                       else context.candidate_subset)
        return _families_kept(context, lambda family: family not in stopped)


class FamilyStarted(dg.AutomationCondition):
    """True for a partition whose family's stimuli (``FAMILY_ENTRY``) were materialised, the
    family read from the partition key: a family x depth asset that does not read the names
    (``assignment_key``) has no partition mapping to them that Dagster could follow (its
    partitions are the design's own keys, not a product with a family dimension). An
    unpartitioned asset: once any family started."""

    @property
    def name(self) -> str:
        return "family_started"

    @property
    def description(self) -> str:
        return "the family's stimuli were materialised"

    async def evaluate(self, context) -> dg.AutomationResult:
        started = await context.asset_graph_view.compute_materialized_asset_subset(FAMILY_ENTRY)
        families = set(started.expensively_compute_partition_keys())
        if context.asset_graph.get(context.key).partitions_def is None:
            return dg.AutomationResult(context=context, true_subset=context.candidate_subset if families
                                       else context.get_empty_subset())
        return _families_kept(context, lambda family: family in families)


def family_started() -> dg.AutomationCondition:
    """True for a partition whose family's stimuli (``FAMILY_ENTRY``) were materialised."""
    return FamilyStarted()


def stage_condition() -> dg.AutomationCondition:
    """An automated asset with upstream assets: fresh inputs whose blocking checks passed."""
    return (AC.eager() & GatesClear() & family_started()).with_label("next stage")


def entry_condition() -> dg.AutomationCondition:
    """An automated asset with no upstream asset: the family's stimuli newly updated (and their
    blocking checks passed) stand in for fresh inputs."""
    stimuli_updated = AC.asset_matches(FAMILY_ENTRY, AC.newly_updated()).with_label("family's stimuli updated")
    return (stimuli_updated.since_last_handled() & family_started() & GatesClear((FAMILY_ENTRY,))
            & ~AC.asset_matches(FAMILY_ENTRY, AC.in_progress()) & ~AC.in_progress()).with_label("stage entry")


class OwnBatches(dg.AutomationCondition):
    """True for the partitions of ``POWER_BATCHES`` that are one of their family's own
    simulation batches (``partitions.power_partition_keys``), and for every partition of any
    other asset: a family runs only its own batches."""

    def __init__(self, own: frozenset[str] = OWN_BATCHES):
        self._own = own

    @property
    def name(self) -> str:
        return "own_batches"

    @property
    def description(self) -> str:
        return "one of the family's own simulation batches"

    def evaluate(self, context) -> dg.AutomationResult:
        if context.key != POWER_BATCHES:
            return dg.AutomationResult(context=context, true_subset=context.candidate_subset)
        return dg.AutomationResult(context=context, true_subset=context.asset_graph_view.
                                   compute_intersection_with_partition_keys(set(self._own), context.candidate_subset))


def power_condition() -> dg.AutomationCondition:
    """The power simulation's batches: the stage condition, for the family's own batches only."""
    return (stage_condition() & OwnBatches()).with_label("next stage (own batches)")


def power_summary_condition() -> dg.AutomationCondition:
    """The power summary: eager, with "none missing" read over the family's own batches."""
    own_missing = AC.any_deps_match(AC.missing() & ~AC.will_be_requested() & OwnBatches())
    return ((AC.newly_missing() | AC.any_deps_updated()).since_last_handled() & ~own_missing
            & ~AC.any_deps_in_progress() & ~AC.in_progress() & GatesClear()
            & family_started()).with_label("next stage (own batches done)")


#: Assets whose condition is not the plain stage condition.
SPECIAL = {POWER_BATCHES: power_condition, dg.AssetKey("power_summary"): power_summary_condition}


class FamilyRegistered(dg.AutomationCondition):
    """True for the partitions whose family's registration record is issued
    (``registration.issue.family_mode``, read at each evaluation)."""

    def __init__(self, registration_dir: str | Path = DEFAULT_REGISTRATION_DIR):
        self._dir = Path(registration_dir)

    @property
    def name(self) -> str:
        return "family_registered"

    @property
    def description(self) -> str:
        return "the family's registration record is issued (fear register)"

    def evaluate(self, context) -> dg.AutomationResult:
        return _families_kept(context, lambda family: family_mode(self._dir, family) == CONFIRMATORY)


def registered_condition(registration_dir: str | Path) -> dg.AutomationCondition:
    """An asset after registration: the stage condition, for a registered family only."""
    return (stage_condition() & FamilyRegistered(registration_dir)).with_label("next stage (registered family)")


def automated(assets: Iterable[dg.AssetsDefinition], stages=AUTOMATED_STAGES,
              registration_dir: str | Path = DEFAULT_REGISTRATION_DIR) -> list[dg.AssetsDefinition]:
    """``assets`` with the automation condition on every asset of ``stages``, and on every
    family-partitioned asset of ``REGISTERED_STAGES`` for registered families; others unchanged."""
    out = []
    for a in assets:
        conditions = {key: (SPECIAL[key]() if key in SPECIAL else stage_condition() if a.specs_by_key[key].deps
                            else entry_condition())
                      for key in a.keys if a.group_names_by_key.get(key) in stages}
        if a.partitions_def is not None:
            conditions |= {key: registered_condition(registration_dir) for key in a.keys
                           if a.group_names_by_key.get(key) in REGISTERED_STAGES}
        out.append(a.with_attributes(automation_condition=conditions) if conditions else a)
    return out


def automation_sensor(assets: Iterable[dg.AssetsDefinition]) -> dg.AutomationConditionSensorDefinition:
    """The sensor that evaluates the conditions, on by default (the daemon runs it)."""
    keys = [k for a in assets for k in a.keys if a.specs_by_key[k].automation_condition is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # use_user_code_server: a beta API we rely on deliberately
        return dg.AutomationConditionSensorDefinition(
            SENSOR_NAME, target=dg.AssetSelection.assets(*keys), default_status=dg.DefaultSensorStatus.RUNNING,
            minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, run_tags={LAUNCHED_BY_TAG: "automation"},
            # one run per partition, each tagged as launched by the automation (not a backfill)
            emit_backfills=False,
            # OwnBatches and GatesClear are project code: the sensor evaluates in the code server
            use_user_code_server=True,
            description="Stage-to-stage automation (site configuration 'automation: true'): materialises a "
                        "family's pilot and registration draft once its stimuli exist, and a registered family's "
                        "collection, probes, analysis and reading once its record is issued, each step when its "
                        "inputs are fresh and their blocking checks passed (fear_assets/defs/automation.py says "
                        "which stages and why).")


def model_retry_policy(site: SiteConfig = DEFINITION_SITE, delay: float = RETRY_DELAY_SECONDS) -> dg.RetryPolicy:
    """Retries of a failed model step: ``site.retries``, exponential backoff with jitter."""
    return dg.RetryPolicy(max_retries=site.retries, delay=delay, backoff=dg.Backoff.EXPONENTIAL,
                          jitter=dg.Jitter.PLUS_MINUS)


#: The retry policy of every model step (every asset in pool "gpu").
MODEL_RETRY = model_retry_policy()


def _not_retried(exc: FearAssetsError) -> dg.Failure:
    return dg.Failure(description=str(exc), allow_retries=False)


def model_step(fn: Callable) -> Callable:
    """Wrap a model step's compute function: a ``FearAssetsError`` (a deterministic input
    error) fails the step at once, its message intact, instead of being retried."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except FearAssetsError as exc:
                raise _not_retried(exc) from exc
        wrapper = steps
    else:
        @functools.wraps(fn)
        def step(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except FearAssetsError as exc:
                raise _not_retried(exc) from exc
        wrapper = step
    wrapper.model_step = True  # type: ignore[attr-defined]  # the tests find every wrapped step by it
    return wrapper


def failure_text(error) -> str:
    """A failed step's message with the errors that caused it: once a retried step has used
    its retries Dagster's own message reads "Exceeded max_retries of N" (and a plain error's
    "Error occurred while executing op"), and the cause says why. A cause that repeats the
    message before it (a not-retried project error) is not repeated."""
    parts: list[str] = []
    while error is not None:
        text = error.message.strip()
        if not any(text.split(": ", 1)[-1] in p for p in parts):
            parts.append(text)
        error = error.cause
    return "\ncaused by: ".join(parts)
