"""One family's registered view of the settings: what every stage reads for that family.

``registered(settings, family)`` resolves, once, every choice that depends on the family (the
embedded demonstration's shorter convergence remedy and reduced power simulation, its
reduced design, a quick rehearsal's shorter analysis sampler) so no consumer repeats the rule. The family's mode (pilot until its
registration record is issued, then confirmatory) travels with the view, never with the
settings, so registering one family changes no registered file and no other family. Seeds come from :meth:`Registered.seed`
alone: the one derivation of a random stream from the registered master seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.hashing import sampler_seed
from fear_assets.core.sections import (Convergence, ConvergenceRemedy, Decision, Exclusion, FrameParametrisationRule,
                                       Generation, PositiveControls, Power, PowerDemo, PriorSettings, Probe, Sampler,
                                       SimulationSampler)
from fear_assets.core.settings import MODES, Block, Design, Family, ProtocolSettings, ReducedDesign



@dataclass(frozen=True)
class Registered:
    """The registered numbers and rules one family's steps read (protocol 6.1-6.3)."""

    settings: ProtocolSettings
    family: Family
    decision: Decision
    priors: PriorSettings
    sampler: Sampler
    convergence: Convergence
    #: 6.3 (issue 28): the power simulation's sampler on the accelerator path.
    simulation_sampler: SimulationSampler
    frame_parametrisation: FrameParametrisationRule
    #: 6.1-6.2's remedy for a contrast short of the convergence rule (the demo's limit for the
    #: embedded family).
    convergence_remedy: ConvergenceRemedy
    positive_controls: PositiveControls
    exclusion: Exclusion
    probe: Probe
    #: 4.5: the greedy answer's length.
    generation: Generation
    power: Power
    #: "pilot" until the family's registration record is issued, then "confirmatory".
    mode: str = "pilot"

    @property
    def confirmatory(self) -> bool:
        """The family is registered: its registration gates block and its record is frozen."""
        return self.mode == "confirmatory"

    @property
    def embedded(self) -> bool:
        """The embedded demonstration family (descriptive labels, reduced designs)."""
        return self.family.role == "embedded"

    @property
    def master_seed(self) -> int:
        return self.settings.master_seed

    def seed(self, *purpose: object) -> int:
        """The seed of one random stream: the registered master seed, this family and the
        purpose path (``seed("posteriors", "H2")``), the same on every machine."""
        return sampler_seed(self.settings.master_seed, *purpose)

    @property
    def rehearsal(self) -> bool:
        """A rehearsal (``fear rehearse``): random-weight stand-ins at the registered shape, whose
        gates never block and whose record is never a registration."""
        return self.family.reduced_design is not None and self.family.reduced_design.rehearsal

    @property
    def power_reduction(self) -> PowerDemo | None:
        """The reduced power simulation this family runs instead of the registered one: the
        embedded demo's (``power.demo``) or a rehearsal's (its reduced design's ``power``);
        None: the registered simulation (6.3)."""
        if self.embedded:
            return self.power.demo
        reduced = self.family.reduced_design
        return reduced.power if reduced is not None else None

    @property
    def power_datasets(self) -> int:
        """Datasets per scenario and frame count (a reduced simulation's number where it has one)."""
        reduced = self.power_reduction
        return reduced.datasets if reduced is not None else self.power.datasets

    @property
    def power_sampler(self) -> Sampler:
        """The sampler of the power simulation's fits (a reduced simulation's shorter one)."""
        reduced = self.power_reduction
        return reduced.sampler if reduced is not None else self.sampler

    @property
    def power_scenarios(self) -> tuple[str, ...]:
        """The scenarios the power simulation runs (a reduced simulation's fewer)."""
        reduced = self.power_reduction
        return reduced.scenarios if reduced is not None else self.power.scenarios

    @property
    def depth_keys(self) -> tuple[str, ...]:
        """The family's depth partition keys, d1..dN (D1)."""
        return self.family.depth_keys

    @property
    def reduced_design(self) -> ReducedDesign | None:
        """The demonstration family's smaller registered design (None: the full design)."""
        return self.family.reduced_design

    @property
    def design(self) -> Design:
        return self.settings.design

    @property
    def blocks(self) -> tuple[Block, ...]:
        return self.settings.blocks

    @property
    def confirmatory_frames_per_fear(self) -> int:
        """Frames each fear keeps after the pilot gates (4.3) under this family's design."""
        return self.settings.confirmatory_frames_per_fear(self.family.key)


def registered(settings: ProtocolSettings, family_key: str, mode: str = "pilot") -> Registered:
    """The registered view of ``family_key`` in ``mode`` (an unknown family is a SettingsError
    naming the fix; the mode comes from ``registration.issue.family_mode``)."""
    if mode not in MODES:
        raise FearAssetsError(f"unknown mode {mode!r} for family {family_key!r}: use one of {', '.join(MODES)} "
                              "(registration.issue.family_mode gives a family's mode)")
    family = settings.family(family_key)
    remedy = settings.fitting.convergence_remedy.for_family(family.role == "embedded")
    sampler, reduced = settings.sampler, family.reduced_design
    # A rehearsal's reduced design may register a shorter analysis sampler and remedy (said in its reason).
    if reduced is not None and reduced.sampler is not None:
        sampler = reduced.sampler
    if reduced is not None and reduced.max_extensions is not None:
        remedy = dataclasses.replace(remedy, max_extensions=reduced.max_extensions)
    return Registered(settings=settings, family=family, decision=settings.decision, priors=settings.priors,
                      sampler=sampler, convergence=settings.convergence,
                      simulation_sampler=settings.simulation_sampler,
                      frame_parametrisation=settings.fitting.frame_parametrisation, convergence_remedy=remedy,
                      positive_controls=settings.positive_controls, exclusion=settings.exclusion,
                      probe=settings.probe, generation=settings.generation, power=settings.power, mode=mode)
