"""The batches of a family's power simulation (6.3, Appendix C step 3): the registered one
(scenarios x 50..100 frames x 2,000 datasets, in batches) or a reduced one (the embedded
family's demo, a rehearsal's: ``Registered.power_reduction``). Pure: the batch keys are the partition keys of ``power_simulation``."""

from __future__ import annotations

import math

from fear_assets.core.registered import registered
from fear_assets.core.settings import ProtocolSettings
from fear_assets.simulation.store import batch_key
from fear_assets.simulation.targets import PowerTargets, frame_sequence


def batch_keys_of(settings: ProtocolSettings, family_key: str) -> list[str]:
    """Batch keys ``<scenario>.f<frames>.b<batch>`` of one family's simulation."""
    p = settings.power
    reduced = registered(settings, family_key).power_reduction
    if reduced is not None:
        frames, datasets, scenarios = [reduced.frames], reduced.datasets, reduced.scenarios
    else:
        frames, datasets, scenarios = frame_sequence(PowerTargets.from_settings(settings)), p.datasets, p.scenarios
    n_batches = math.ceil(datasets / p.batch_size)
    return [batch_key(s, f, b) for s in scenarios for f in frames for b in range(n_batches)]


def all_batch_keys(settings: ProtocolSettings) -> list[str]:
    return sorted({k for fam in settings.families for k in batch_keys_of(settings, fam)})
