"""One family's registered view of the settings: what every stage reads for that family.

``registered(settings, family)`` resolves, once, every choice that depends on the family (the
embedded demonstration's shorter convergence remedy and reduced power simulation, its
reduced design) so no consumer repeats the rule. Seeds come from :meth:`Registered.seed`
alone: the one derivation of a random stream from the registered master seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fear_assets.core.hashing import derived_seed
from fear_assets.core.sections import (ConvergenceRemedy, Convergence, Decision, Exclusion, FrameParametrisationRule,
                                       PositiveControls, Power, PriorSettings, Probe, Sampler)
from fear_assets.core.settings import Family, ProtocolSettings

#: Seeds handed to samplers and generators are 31-bit (PyMC's and NumPy's legacy bound).
SEED_BOUND = 2**31


@dataclass(frozen=True)
class Registered:
    """The registered numbers and rules one family's steps read (protocol 6.1-6.3)."""

    settings: ProtocolSettings
    family: Family
    decision: Decision
    priors: PriorSettings
    sampler: Sampler
    convergence: Convergence
    frame_parametrisation: FrameParametrisationRule
    #: 6.1-6.2's remedy for a contrast short of the convergence rule (the demo's limit for the
    #: embedded family).
    convergence_remedy: ConvergenceRemedy
    positive_controls: PositiveControls
    exclusion: Exclusion
    probe: Probe
    power: Power

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
        return derived_seed(self.settings.master_seed, *purpose) % SEED_BOUND

    @property
    def power_datasets(self) -> int:
        """Datasets per scenario and frame count: the demo's reduced number for the embedded family."""
        return self.power.demo.datasets if self.embedded else self.power.datasets

    @property
    def power_sampler(self) -> Sampler:
        """The sampler of the power simulation's fits (the demo's shorter one for the embedded family)."""
        return self.power.demo.sampler if self.embedded else self.sampler


def registered(settings: ProtocolSettings, family_key: str) -> Registered:
    """The registered view of ``family_key`` (an unknown family is a SettingsError naming the fix)."""
    family = settings.family(family_key)
    remedy = settings.fitting.convergence_remedy
    if family.role == "embedded":
        remedy = dataclasses.replace(remedy, max_extensions=remedy.demo_max_extensions)
    return Registered(settings=settings, family=family, decision=settings.decision, priors=settings.priors,
                      sampler=settings.sampler, convergence=settings.convergence,
                      frame_parametrisation=settings.fitting.frame_parametrisation, convergence_remedy=remedy,
                      positive_controls=settings.positive_controls, exclusion=settings.exclusion,
                      probe=settings.probe, power=settings.power)
