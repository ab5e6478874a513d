"""Typed sections of the registered settings (issue 12): one frozen dataclass per section,
each field declared with the constraint it must meet, validated once when the settings load.

In the spirit of scikit-learn's parameter constraints: a field's constraint sits beside the
field, and a value that breaks it raises a :class:`SettingsError` naming
``data/protocol_settings.yaml``, the section, the field and the fix. Code reads the values by
attribute (``settings.matching.tost_alpha``), never by string key at the point of use.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from fear_assets.core.errors import InputError, SettingsError


@dataclass(frozen=True)
class Constraint:
    """A check on one registered value: ``convert`` returns the typed value or None if it fails."""

    describe: str
    convert: Callable[[Any], Any]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def interval(low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Constraint:
    def convert(value):
        x = _number(value)
        if x is None or (low is not None and (x <= low if low_open else x < low)) or (high is not None and x > high):
            return None
        return x
    lo = "-inf" if low is None else low
    return Constraint(f"a number in {'(' if low_open else '['}{lo}, {'inf' if high is None else high}]", convert)


PROBABILITY = interval(0.0, 1.0)
POSITIVE = interval(0.0, low_open=True)
REAL = interval()


def integer(minimum: int) -> Constraint:
    return Constraint(f"an integer >= {minimum}",
                      lambda v: v if isinstance(v, int) and not isinstance(v, bool) and v >= minimum else None)


TEXT = Constraint("a text", lambda v: v if isinstance(v, str) else None)
BOOLEAN = Constraint("true or false", lambda v: v if isinstance(v, bool) else None)
TEXTS = Constraint("a list of texts (quote words YAML reads as booleans)",
                   lambda v: tuple(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else None)
TEXT_PAIR = Constraint("a list of two texts",
                       lambda v: tuple(v) if isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)
                       else None)
TEXT_MAP = Constraint("a mapping of texts to texts",
                      lambda v: dict(v) if isinstance(v, Mapping) and all(isinstance(x, str) for x in v.values())
                      else None)
ROPE = Constraint("an interval [-x, x] around 0",
                  lambda v: tuple(float(x) for x in v) if isinstance(v, list) and len(v) == 2
                  and all(_number(x) is not None for x in v) and v[0] < 0 < v[1] else None)
CLIP = Constraint("two probabilities [low, high], low < high",
                  lambda v: tuple(float(x) for x in v) if isinstance(v, list) and len(v) == 2
                  and all(_number(x) is not None and 0 < x < 1 for x in v) and v[0] < v[1] else None)


def unknown_keys(path: Path, where: str, mapping: Mapping[str, Any], known,
                 error: type[InputError] = SettingsError) -> None:
    """Reject a key the file does not define (a typo must not load silently); ``error`` is the
    file's error class (the registered settings', or the site configuration's)."""
    known = [str(k) for k in known]
    for key in mapping:
        if str(key) not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise error(path, where, str(key), f"unknown key {str(key)!r}",
                        f"{hint}write one of {', '.join(known)} under '{where}', or remove the key")


def registered(constraint: Constraint, fix: str = "") -> Any:
    """A field of a typed section, with its constraint (and, optionally, what to write instead)."""
    return field(metadata={"constraint": constraint, "fix": fix})


class Section:
    """Base of a typed section: built and validated by :meth:`from_settings`."""

    NAME: ClassVar[str]

    @classmethod
    def from_settings(cls, path: Path, raw: Mapping[str, Any]):
        where = cls.NAME
        if not isinstance(raw.get(where), Mapping):
            raise SettingsError(path, "<top>", where, "missing section", f"add the '{where}' section")
        return cls.from_mapping(path, where, raw[where])

    @classmethod
    def from_mapping(cls, path: Path, where: str, section: Mapping[str, Any]):
        """Build from one mapping (a section, or a sub-section named ``where``)."""
        unknown_keys(path, where, section, [f.name for f in dataclasses.fields(cls)])
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in section:
                raise SettingsError(path, where, f.name, "missing", f"add '{f.name}' under '{where}'")
            sub = f.metadata.get("section")
            if sub is not None:
                if not isinstance(section[f.name], Mapping):
                    raise SettingsError(path, where, f.name, f"{section[f.name]!r} is not a mapping",
                                        f"write '{where}.{f.name}' as a mapping with "
                                        f"{', '.join(g.name for g in dataclasses.fields(sub))}")
                values[f.name] = sub.from_mapping(path, f"{where}.{f.name}", section[f.name])
                continue
            constraint: Constraint = f.metadata["constraint"]
            value = constraint.convert(section[f.name])
            if value is None:
                raise SettingsError(path, where, f.name, f"{section[f.name]!r} is not {constraint.describe}",
                                    f.metadata["fix"] or f"set '{where}.{f.name}' to {constraint.describe}")
            values[f.name] = value
        made = cls(**values)
        problem = made.check()
        if problem:
            raise SettingsError(path, where, problem[0], problem[1], problem[2])
        return made

    def check(self) -> tuple[str, str, str] | None:
        """A rule across fields: (field, problem, fix), or None."""
        return None

    def as_written(self) -> dict[str, Any]:
        """The section as the file writes it (lists, nested mappings), for messages and records."""
        def plain(value):
            if isinstance(value, Section):
                return value.as_written()
            return [plain(v) for v in value] if isinstance(value, tuple) else value
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _ordered(section: Section, low: str, high: str) -> tuple[str, str, str] | None:
    if not getattr(section, low) < getattr(section, high):
        return (high, f"{getattr(section, high)} is not above {low} {getattr(section, low)}",
                f"make {section.NAME}.{low} < {section.NAME}.{high}")
    return None


@dataclass(frozen=True)
class Decision(Section):
    """6.1-6.2: the decision rule (SESOI, meaningful size, ROPE, HDI mass)."""

    NAME: ClassVar[str] = "decision"
    sesoi: float = registered(POSITIVE, "use the registered positive SESOI (0.15)")
    meaningful: float = registered(POSITIVE, "use the registered meaningful size (0.30)")
    rope: tuple[float, float] = registered(ROPE, "write it as [-x, x]")
    hdi_prob: float = registered(PROBABILITY, "use a proportion between 0 and 1 (0.99)")
    #: 6.2's four labels, in the registered order.
    labels: tuple[str, ...] = registered(TEXTS)

    def check(self):
        # 6.2 defines the ROPE as +-SESOI; the file registers both, so they must agree.
        if self.rope != (-self.sesoi, self.sesoi):
            return ("rope", f"{list(self.rope)} is not [-sesoi, +sesoi] = [{-self.sesoi}, {self.sesoi}]",
                    f"write decision.rope as [{-self.sesoi}, {self.sesoi}] (6.2: the ROPE is +-SESOI), "
                    "or change decision.sesoi")
        return None


@dataclass(frozen=True)
class Matching(Section):
    """4.3: surprisal matching and the bank-level equivalence test."""

    NAME: ClassVar[str] = "matching"
    max_abs_difference: float = registered(POSITIVE)
    tost_bound: float = registered(POSITIVE)
    tost_alpha: float = registered(PROBABILITY)


@dataclass(frozen=True)
class ZeroPreference(Section):
    """4.3: the band every no-document option probability must lie in."""

    NAME: ClassVar[str] = "zero_preference"
    low: float = registered(PROBABILITY)
    high: float = registered(PROBABILITY)

    def check(self):
        return _ordered(self, "low", "high")


@dataclass(frozen=True)
class Binding(Section):
    """4.2: single-sentence and in-context binding checks."""

    NAME: ClassVar[str] = "binding"
    pass_rate_min: float = registered(PROBABILITY)
    single_sentence_checks_per_frame: int = registered(integer(1))
    expected_letter: dict = registered(TEXT_MAP, "map each agent (self, peer, person) to its answer letter")


@dataclass(frozen=True)
class ReportScoring(Section):
    """4.5: keyword rule against the blinded scorer."""

    NAME: ClassVar[str] = "report_scoring"
    kappa_min: float = registered(PROBABILITY)
    refusal_phrases: tuple[str, ...] = registered(TEXTS)
    scorer_letters: tuple[str, str] = registered(TEXT_PAIR, "write the scorer's yes and no answers, e.g. [Yes, No]")


@dataclass(frozen=True)
class DepthBandRule(Section):
    """5: the depth band from the neutral partner's mention rate."""

    NAME: ClassVar[str] = "depth_band"
    neutral_mention_low: float = registered(PROBABILITY)
    neutral_mention_high: float = registered(PROBABILITY)
    min_depths: int = registered(integer(1))
    fallback_target: float = registered(PROBABILITY)

    def check(self):
        return _ordered(self, "neutral_mention_low", "neutral_mention_high")


@dataclass(frozen=True)
class H5DepthRule(Section):
    """5: the H5 depth from pooled forced-choice accuracy."""

    NAME: ClassVar[str] = "h5_depth"
    accuracy_low: float = registered(PROBABILITY)
    accuracy_high: float = registered(PROBABILITY)
    fallback_target: float = registered(PROBABILITY)

    def check(self):
        return _ordered(self, "accuracy_low", "accuracy_high")


@dataclass(frozen=True)
class Sampler(Section):
    """6.1: draws, tuning steps and chains of every registered fit."""

    NAME: ClassVar[str] = "sampler"
    draws: int = registered(integer(1))
    tune: int = registered(integer(0))
    chains: int = registered(integer(1))


#: The samplers of the power simulation's accelerator path (``simulation.vectorised``).
SIMULATION_ALGORITHMS = ("adaptive_hmc_dense_pooled", "chees_hmc", "nuts")
SIMULATION_ALGORITHM = Constraint(f"one of {list(SIMULATION_ALGORITHMS)}",
                                  lambda v: v if isinstance(v, str) and v in SIMULATION_ALGORITHMS else None)


@dataclass(frozen=True)
class SimulationSampler(Section):
    """6.3: how the power simulation's datasets are sampled on the accelerator path, many
    (dataset, chain) pairs in one compiled program. A change of the simulation's sampler from the
    registered ``sampler`` (the nutpie loop's), recorded as such: the model, priors and
    convergence rule are the registered ones. ``adaptive_hmc_dense_pooled``
    (``vectorised.BatchedAdaptiveHMC``): each dataset adapts its own step size (towards
    ``target_accept``) and block mass matrix in its ``warmup``, with one trajectory length for
    the program, pooled over at least ``min_pooled_chains`` chains (helper chains of its own
    datasets where it has fewer); the only one that passed item 3(a) at the registered size.
    ``chees_hmc``: jittered fixed-length HMC tuned once (ChEES) on ``pilot_datasets`` datasets
    for ``pilot_steps`` steps, then frozen (``warmup`` only moves the chains); ``nuts``: NUTS
    from a reference adaptation. Per dataset: ``chains`` chains and ``draws`` draws; a dataset
    short of the convergence rule on any reported contrast is refitted with ``extension_draws``
    more draws in a later batch, and then counted and kept as D7 says."""

    NAME: ClassVar[str] = "simulation_sampler"
    algorithm: str = registered(SIMULATION_ALGORITHM)
    chains: int = registered(integer(2), "R-hat needs at least 2 chains; 4 are suggested")
    warmup: int = registered(integer(0))
    draws: int = registered(integer(1))
    target_accept: float = registered(interval(0.0, 1.0, low_open=True))
    min_pooled_chains: int = registered(integer(0), "0 sets no floor")
    pilot_datasets: int = registered(integer(1))
    pilot_steps: int = registered(integer(1))
    extension_draws: int = registered(integer(0))


@dataclass(frozen=True)
class Convergence(Section):
    """6.1: the convergence rule every reported contrast must meet."""

    NAME: ClassVar[str] = "convergence"
    rhat_max: float = registered(interval(1.0), "R-hat is at least 1; the registered maximum is 1.01")
    ess_bulk_min: int = registered(integer(0))
    ess_tail_min: int = registered(integer(0))
    divergences_max: int = registered(integer(0))


@dataclass(frozen=True)
class PositiveControls(Section):
    """4.6 / D4: the positive controls' pass rule and the pilot blocks that carry them."""

    NAME: ClassVar[str] = "positive_controls"
    pass_min_mean: float = registered(REAL)
    hdi_above: float = registered(REAL)
    marker: str = registered(TEXT)
    pilot_blocks: tuple[str, ...] = registered(TEXTS)


@dataclass(frozen=True)
class Exclusion(Section):
    """4.8: the per-cell exclusion rate above which a cell is flagged."""

    NAME: ClassVar[str] = "exclusion"
    cell_flag_rate: float = registered(PROBABILITY)


@dataclass(frozen=True)
class Probe(Section):
    """6.1: the linear probes of H4."""

    NAME: ClassVar[str] = "probe"
    inverse_regularisation: float = registered(POSITIVE)
    clip: tuple[float, float] = registered(CLIP)
    ceiling_accuracy: float = registered(PROBABILITY)
    control_interval: float = registered(PROBABILITY)
    layers_fraction_from: float = registered(PROBABILITY)


@dataclass(frozen=True)
class Generation(Section):
    """4.5: the greedy answer."""

    NAME: ClassVar[str] = "generation"
    max_new_tokens: int = registered(integer(1))
    greedy: bool = registered(BOOLEAN)


POSITIVE_PAIR = Constraint("two positive numbers [shape, rate]",
                           lambda v: tuple(float(x) for x in v) if isinstance(v, list) and len(v) == 2
                           and all(_number(x) is not None and x > 0 for x in v) else None)


@dataclass(frozen=True)
class PriorSettings(Section):
    """D3: the registered priors of every model (scales of the half-normal and normal priors)."""

    NAME: ClassVar[str] = "priors"
    fixed_effect_sd: float = registered(POSITIVE)
    intercept_sd: float = registered(POSITIVE)
    group_sd_halfnormal: float = registered(POSITIVE)
    residual_sd_halfnormal: float = registered(POSITIVE)
    student_t_nu_gamma: tuple[float, float] = registered(POSITIVE_PAIR)
    lkj_eta: float = registered(POSITIVE)
    h5_probit_fixed_sd: float = registered(POSITIVE)
    gate_c_reader_factor_sd: float = registered(POSITIVE)
    sensitivity_fixed_effect_sd: float = registered(POSITIVE)


#: D7's scenarios (the generator sizes each one: ``simulation.generator.scenario_size``).
SCENARIOS = ("meaningful", "null", "sesoi")
SCENARIO_LIST = Constraint(f"a list of scenarios out of {list(SCENARIOS)} (quote \"null\": YAML reads null as None)",
                           lambda v: tuple(v) if isinstance(v, list) and v and all(x in SCENARIOS for x in v)
                           and len(set(v)) == len(v) else None)


def nested(section: type) -> Any:
    """A field holding a typed sub-section (``power.demo``): its fields are checked like a section's."""
    return field(metadata={"section": section})


@dataclass(frozen=True)
class FrameParametrisationRule(Section):
    """D3b: the one rule choosing how a primary-model fit samples its frame effects, in the
    analysis and the power simulation alike (``analysis.parametrisation``)."""

    NAME: ClassVar[str] = "fitting.frame_parametrisation"
    centring_min_ratio: float = registered(POSITIVE)
    centring_min_frames: int = registered(integer(2))


@dataclass(frozen=True)
class ConvergenceRemedy(Section):
    """6.1-6.2: what is done when a reported contrast misses the convergence rule: the fit is
    rerun with ``extension_draws`` more draws per extension, at most ``max_extensions`` times;
    a contrast still short is reported as not converged."""

    NAME: ClassVar[str] = "fitting.convergence_remedy"
    extension_draws: int = registered(integer(1))
    max_extensions: int = registered(integer(0))
    # The embedded demonstration's limit (its time budget; its labels are descriptive anyway).
    demo_max_extensions: int = registered(integer(0))

    def for_family(self, embedded: bool) -> "ConvergenceRemedy":
        """The remedy a family's analysis runs under: the demo's limit for the embedded family."""
        return dataclasses.replace(self, max_extensions=self.demo_max_extensions) if embedded else self


@dataclass(frozen=True)
class Fitting(Section):
    """How every registered fit is sampled beyond the sampler's draws (D3b, 6.1-6.2)."""

    NAME: ClassVar[str] = "fitting"
    frame_parametrisation: FrameParametrisationRule = nested(FrameParametrisationRule)
    convergence_remedy: ConvergenceRemedy = nested(ConvergenceRemedy)


#: The blocks the power simulation can generate and fit (``simulation.generator.PRIMARY_MODEL_BLOCKS``
#: describes each; a test keeps the two in step). They are simulated blocks, not design blocks:
#: ``recall`` is the recall branch of the primary block (gate (b)).
SIMULATED_BLOCKS = ("primary", "recall", "service_relevance", "control_instructed_interaction",
                    "control_instructed_priority", "control_marked_priority", "control_addressee_name", "judge", "probe",
                    "forced_choice")
SIMULATED_BLOCK_LIST = Constraint(f"a list of simulated blocks out of {list(SIMULATED_BLOCKS)}",
                                  lambda v: tuple(v) if isinstance(v, list) and v
                                  and all(isinstance(x, str) and x in SIMULATED_BLOCKS for x in v) else None)


@dataclass(frozen=True)
class PowerDemo(Section):
    """The embedded demo's reduced power simulation: NOT the registered simulation (6.3); it
    fits the main job's time budget and says so in every output."""

    NAME: ClassVar[str] = "power.demo"
    datasets: int = registered(integer(1))
    frames: int = registered(integer(1))
    scenarios: tuple[str, ...] = registered(SCENARIO_LIST)
    sampler: Sampler = nested(Sampler)  # the demo's shorter sampler (errors name power.demo.sampler)
    blocks: tuple[str, ...] = registered(SIMULATED_BLOCK_LIST)


@dataclass(frozen=True)
class Power(Section):
    """6.3 / D7: the power simulation's registered targets, scenarios and batching."""

    NAME: ClassVar[str] = "power"
    datasets: int = registered(integer(1), "use the registered 2000 datasets per scenario")
    slope_sd_inflation: float = registered(POSITIVE, "use the registered 1.5")
    supported_at_meaningful_min: float = registered(PROBABILITY)
    supported_at_zero_max: float = registered(PROBABILITY)
    equivalent_at_zero_min: float = registered(PROBABILITY)
    joint_top_reading_min: float = registered(PROBABILITY)
    joint_top_reading_zero_max: float = registered(PROBABILITY)
    gate_b_pass_min: float = registered(PROBABILITY)
    frame_block: int = registered(integer(1))
    frames_max: int = registered(integer(1))
    scenarios: tuple[str, ...] = registered(SCENARIO_LIST)
    batch_size: int = registered(integer(1))
    demo: PowerDemo = nested(PowerDemo)


SECTIONS = (PriorSettings, Decision, Matching, ZeroPreference, Binding, ReportScoring, DepthBandRule, H5DepthRule, Sampler,
            SimulationSampler,
            Convergence, Fitting, PositiveControls, Exclusion, Probe, Generation, Power)
