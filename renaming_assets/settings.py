"""The registered numbers of the anchor-fixed renaming study: the one place for each.

Standard library only (the protocol: "All published code is offline and uses the Python
standard library"). Every module of ``renaming_assets`` reads these by attribute; none
repeats a registered number. ``SETTINGS`` is frozen, and its source file is one of the
hashed sources in ``freeze.json``, so a changed number needs a new manifest.

Numbers the protocol leaves open and this package fixes (documented in the README):
the identifier alphabet and length, the clustered hub-attachment probability, the seeds,
the exact wording of the request templates, and the hypothetical categorical
distributions of ``precision.json``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAMILIES = ("recursive", "spine_fan", "clustered")
LAYOUTS = ("shuffled", "grouped")
TASKS = ("root", "fourth_ancestor", "parent")
NAMINGS = ("original", "unrestricted", "constrained")
RENAMINGS = ("unrestricted", "constrained")
COPIES = (1, 2)


@dataclass(frozen=True)
class Cohort:
    """Protocol, "Cohort and tasks"."""

    worlds_per_family: int = 128
    roots: int = 4
    branches_per_root: int = 4
    nonroot_nodes_per_branch: int = 32
    spine_edges: int = 8
    #: "the same depth-eight spine leaf"; ancestors of the recursive law are "below eight".
    target_depth: int = 8
    #: "Fourth-ancestor ... questions": the ancestor this many edges above the target.
    ancestor_distance: int = 4
    #: spine_fan: "a randomly selected spine position at depth one through seven".
    fan_depths: tuple[int, int] = (1, 7)
    #: clustered: "choose three spine hubs".
    clustered_hubs: int = 3
    #: clustered: "mix hub attachments with recursive offshoots"; the mix is not given, so
    #: each additional node attaches to a hub with this probability (else recursively).
    hub_attachment_probability: float = 0.5
    alternatives: int = 4
    keys: tuple[str, ...] = ("A", "B", "C", "D")

    @property
    def nodes_per_world(self) -> int:
        return self.roots + self.roots * self.branches_per_root * self.nonroot_nodes_per_branch

    @property
    def worlds(self) -> int:
        return self.worlds_per_family * len(FAMILIES)


@dataclass(frozen=True)
class Naming:
    """Identifiers: "All names have the same character length"."""

    #: Consonants only, so no identifier can equal a word of the request templates.
    alphabet: str = "bcdfghjklmnpqrstvwxz"
    length: int = 4


@dataclass(frozen=True)
class Request:
    """Protocol, "Treatments": "a separate single-question Choice request, with model pinned"."""

    model: str = "jev-1.13.0"
    answer_type: str = "choice"


@dataclass(frozen=True)
class Schedule:
    """Protocol, "Scheduling": six naming-by-copy conditions per layout-by-task block."""

    copies: tuple[int, ...] = COPIES
    #: "each naming/copy has mean within-block position exactly 2.5 in every stratum".
    mean_block_position: float = 2.5


@dataclass(frozen=True)
class Inference:
    """Protocol, "Primary estimands and inference" and "Integrity, missingness ..."."""

    bootstrap_draws: int = 10_000
    sign_flip_draws: int = 10_000
    interval_level: float = 0.95
    alpha: float = 0.05
    #: "Holm correction retains a family of two even if an endpoint is unavailable".
    family_size: int = 2
    #: "The smallest effect of engineering interest is 0.10".
    smallest_effect: float = 0.10
    #: "the observed world statistic lies in [-0.5,1]".
    excess_range: tuple[float, float] = (-0.5, 1.0)
    #: "totals within 0.02 plus numerical tolerance of one are accepted".
    probability_total_tolerance: float = 0.02
    numerical_tolerance: float = 1e-9
    #: The two primary endpoints: (naming, layout, task).
    primary: tuple[tuple[str, str, str], ...] = (
        ("constrained", "shuffled", "root"),
        ("constrained", "shuffled", "fourth_ancestor"),
    )


@dataclass(frozen=True)
class Precision:
    """Protocol, "Precision and power planning"."""

    world_sds: tuple[float, ...] = (0.20, 0.35, 0.50, 0.75)
    #: Hypothetical independent-copy categorical distributions (original, renamed) over the
    #: four keys, explicitly not fitted to any observation.
    hypothetical: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = (
        ("identical_deterministic", (1.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)),
        ("identical_uniform", (0.25, 0.25, 0.25, 0.25), (0.25, 0.25, 0.25, 0.25)),
        ("identical_noisy", (0.7, 0.1, 0.1, 0.1), (0.7, 0.1, 0.1, 0.1)),
        ("small_shift", (0.7, 0.1, 0.1, 0.1), (0.5, 0.3, 0.1, 0.1)),
        ("swap_noisy", (0.7, 0.1, 0.1, 0.1), (0.1, 0.7, 0.1, 0.1)),
        ("deterministic_flip", (1.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0)),
    )


@dataclass(frozen=True)
class Seeds:
    """Registered seeds. Every random draw is ``stream(name, *keys)`` of these."""

    study: str = "anchor-fixed-renaming/2026-11-30"
    #: The synthetic test/demo responder; not part of the study's evidence.
    synthetic: str = "anchor-fixed-renaming/synthetic-responder/2026-11-30"


@dataclass(frozen=True)
class Synthetic:
    """The clearly marked synthetic responder for tests and the demo: NOT study numbers.

    Its rows carry ``synthetic: true``; the analyzer refuses to mix them with real rows."""

    #: Probability of the gold key per task (before the world's offset and the shift).
    gold_probability: tuple[tuple[str, float], ...] = (("root", 0.80), ("fourth_ancestor", 0.55),
                                                       ("parent", 0.90))
    #: Half-width of a world's uniform offset on the gold probability.
    world_offset: float = 0.10
    #: Drop in gold probability per naming (a demo effect, so the endpoints move).
    naming_shift: tuple[tuple[str, float], ...] = (("original", 0.0), ("unrestricted", 0.10),
                                                   ("constrained", 0.15))
    #: Share of the non-gold mass on the body's favoured wrong key.
    favoured_wrong_share: float = 0.7
    start: str = "2026-12-01T00:00:00+00:00"
    seconds_between_requests: float = 1.5


@dataclass(frozen=True)
class Settings:
    study: str = "anchor-fixed-renaming"
    cohort: Cohort = Cohort()
    naming: Naming = Naming()
    request: Request = Request()
    schedule: Schedule = Schedule()
    inference: Inference = Inference()
    precision: Precision = Precision()
    seeds: Seeds = Seeds()
    synthetic: Synthetic = Synthetic()


SETTINGS = Settings()


def stream(seed: str, *keys: object) -> random.Random:
    """An independent generator for one named draw: ``random.Random`` seeded with the
    string ``seed:key1:key2...`` (string seeds are hashed with SHA-512, so the stream does
    not depend on PYTHONHASHSEED or the platform)."""
    return random.Random(":".join([seed, *map(str, keys)]))
