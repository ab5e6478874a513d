"""The registered design of one simulated dataset (protocol 4.7, 6.3; D2, D7).

Every simulated dataset of a family at a frame count shares one design: frames (an equal
number per fear class; blocks of 10 add 2 per fear), the three name rotations, the two
orders, the family's depths and the six primary cells, with the content option from the
registered option rule (4.3). So X, Z, frames and units are fixed and only the outcomes
differ between datasets. The two surprisal covariates are not known for frames that are not
yet written, so they are drawn once per design (seeded from the registered settings) with
the spread measured in the pilot, then centred as the model registers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fear_assets.analysis.controls import ADDRESSEE_AGENTS
from fear_assets.models.data import AGENTS, CONTENTS, levels_of
from fear_assets.models.primary_model import COVARIATES, PrimaryData, prepare
from fear_assets.design.trials import content_option, forced_choice_first_listed


@dataclass(frozen=True)
class AddresseeDesign:
    """The addressee control's block (4.6): its own registered cells on the same frames."""

    table: pd.DataFrame
    data: PrimaryData
    band: tuple[str, ...]


def addressee_design(settings, depth_keys: Sequence[str], band: Sequence[str], n_frames: int, seed: int,
                     rotations_at: Mapping[int, Sequence[int]] | None = None) -> AddresseeDesign:
    """The addressee control's block: its own registered cells, no surprisal covariates (4.6)."""
    table = design_table(settings, depth_keys, n_frames, list(settings.fears), (), seed, cell_set="control_addressee",
                         rotations_at=rotations_at)
    levels = levels_of(table, settings.fears, ADDRESSEE_AGENTS)
    d = prepare(table.assign(outcome=0.0), levels, outcome="outcome", covariates=())
    return AddresseeDesign(table, d, tuple(band))


@dataclass(frozen=True)
class SimulatedDesign:
    """The model table (one row per trial, no outcome) and the prepared model inputs."""

    table: pd.DataFrame
    data: PrimaryData
    band: tuple[str, ...]
    n_frames: int
    #: The addressee control's own block (``AddresseeDesign``) on the same frames.
    addressee: AddresseeDesign | None = None
    #: The registered H5 depth (H5's forced choices are read there).
    h5_depth: str | None = None

    @property
    def rows(self) -> int:
        return len(self.table)


def design_table(settings, depth_keys: Sequence[str], n_frames: int, fears: Sequence[str],
                 covariate_sd: Sequence[float], seed: int, cell_set: str = "primary",
                 rotations_at: Mapping[int, Sequence[int]] | None = None) -> pd.DataFrame:
    """One row per trial: frame x rotation x order x depth x cell (D2's primary block, or the
    block of registered cell set ``cell_set``: the addressee control's own cells), with the
    forced-choice listing order of 4.1/4.5 (H5's position term). ``rotations_at`` (depth index
    -> rotations) is a reduced design's thinned depths, simulated as the family builds them
    (``Family.rotations_at``); a depth not in it has every registered rotation."""
    if n_frames <= 0 or n_frames % len(fears):
        raise ValueError(f"frame count {n_frames} must be a positive multiple of the {len(fears)} fear classes "
                         f"(6.3 adds frames in blocks of 10, 2 per fear): pass one of 50, 60, ... 100")
    rng = np.random.default_rng(seed)
    cells = [tuple(c) for c in settings.cell_set(cell_set)]
    rows = []
    for f, rotation, order, (k, depth) in itertools.product(range(n_frames), sorted(settings.rotations),
                                                             settings.orders, enumerate(depth_keys, start=1)):
        if rotations_at is not None and rotation not in rotations_at.get(k, (rotation,)):
            continue
        frame = f"S{f + 1:03d}"
        fear = fears[f % len(fears)]
        for cell_index, (agent, content) in enumerate(cells, start=1):
            rows.append({"frame": frame, "fear": fear, "rotation": rotation, "order": order, "depth": depth,
                         "agent": agent, "content": content,
                         "option": content_option(settings, rotation, order, k, cell_index),
                         "fc_first_listed": forced_choice_first_listed(settings, f + 1, rotation, order, k),
                         "unit": f"{frame}|r{rotation}|o{order}|{depth}"})
    table = pd.DataFrame(rows)
    for name, sd in zip(COVARIATES, covariate_sd):
        table[name] = rng.normal(0.0, float(sd), size=len(table))
    return table


def levels(settings, depth_keys: Sequence[str], fears: Sequence[str]) -> dict[str, list]:
    return {"agent": list(AGENTS), "content": list(CONTENTS), "depth": list(depth_keys),
            "order": list(settings.orders), "option": [1, 2], "rotation": sorted(settings.rotations),
            "fear": list(fears)}


def simulated_design(settings, depth_keys: Sequence[str], band: Sequence[str], n_frames: int,
                     covariate_sd: Sequence[float], seed: int, h5_depth: str | None = None,
                     rotations_at: Mapping[int, Sequence[int]] | None = None) -> SimulatedDesign:
    """The design at ``n_frames`` frames over ``depth_keys`` (the family's registered depths);
    ``band`` is the registered depth band over which H1-H3 are averaged; ``h5_depth`` the
    registered H5 depth (None: the band's deepest depth, the pilot's rule not yet run)."""
    fears = list(settings.fears)
    missing = [b for b in band if b not in depth_keys]
    if missing:
        raise ValueError(f"band depths {missing} are not among the design's depths {list(depth_keys)}")
    table = design_table(settings, depth_keys, n_frames, fears, covariate_sd, seed, rotations_at=rotations_at)
    d = prepare(table.assign(delta=0.0), levels(settings, depth_keys, fears))
    h5 = h5_depth if h5_depth is not None else list(band)[-1]
    if h5 not in depth_keys:
        raise ValueError(f"H5 depth {h5!r} is not among the design's depths {list(depth_keys)}")
    addressee = addressee_design(settings, depth_keys, band, n_frames, seed, rotations_at)
    return SimulatedDesign(table, d, tuple(band), n_frames, addressee, h5)
