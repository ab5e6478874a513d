"""Which sampler fits a power-simulation batch (6.3): the registered nutpie loop, or the
accelerator path (many datasets in one compiled program, ``simulation.accelerated``) under the
registered ``simulation_sampler`` section.

The host says which it prefers (the site configuration's ``power_sampler.path``: ``auto``,
``nutpie`` or ``accelerator``; never part of the registered record) and where its validation
of the accelerator path is (``power_sampler.validation``: the JSON ``benchmarks/power_gpu.py
validate`` writes). ``auto`` takes the accelerator path only where JAX reports a GPU and a
validation of exactly the registered simulation sampler passed; otherwise the nutpie loop. A
host may force the accelerator path (a CPU, a test) in pilot mode; a registered family's batch
on it needs a passed validation. Every batch records the path, the sampler's settings and the
validation's status. Pure: the step reads the file and asks JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from fear_assets.core.errors import InputError
from fear_assets.core.site import POWER_PATHS as HOST_CHOICES  # the host's choices (site power_sampler.path)
NUTPIE_LOOP = "nutpie_loop"
ACCELERATOR = "accelerator"
#: The settings a validation must have run with to vouch for the registered simulation sampler.
VALIDATED_FIELDS = ("algorithm", "chains", "warmup", "draws", "target_accept")


@dataclass(frozen=True)
class ValidationStatus:
    """What the host's validation file says of the registered simulation sampler:
    ``passed``, ``failed``, ``other_sampler`` (it validated other settings) or ``none`` (no
    file); ``detail`` says why, ``file`` and ``sha256`` name the file read."""

    status: str
    detail: str
    file: str = ""
    sha256: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def as_text(self) -> str:
        where = f" ({self.file}, sha256 {self.sha256[:12]})" if self.file else ""
        return f"{self.status}: {self.detail}{where}"


def validation_status(record: Mapping | None, sampler, file: str = "", sha256: str = "") -> ValidationStatus:
    """The status of the accelerator path's validation ``record`` (the JSON ``validate``
    writes; None: the host names none) for the registered ``sampler`` (the settings'
    ``simulation_sampler``): a validation of other settings vouches for nothing."""
    if record is None:
        return ValidationStatus("none", "no validation of the accelerator path is configured on this host")
    ran = record.get("sampler") or {}
    differs = [f"{k} {ran.get(k)!r} (registered {getattr(sampler, k)!r})" for k in VALIDATED_FIELDS
               if ran.get(k) != getattr(sampler, k)]
    if differs:
        return ValidationStatus("other_sampler", "it validated other settings: " + ", ".join(differs), file, sha256)
    if record.get("passed") is True:
        return ValidationStatus("passed", f"{record.get('datasets', '?')} datasets at {record.get('frames', '?')} "
                                f"frames x {record.get('depths', '?')} depths", file, sha256)
    reasons = "; ".join((record.get("verdict") or {}).get("reasons", [])) or "its verdict is not 'passed'"
    return ValidationStatus("failed", reasons, file, sha256)


@dataclass(frozen=True)
class SamplerPath:
    """The path a batch is fitted on, why, and the validation it rests on."""

    path: str
    reason: str
    validation: ValidationStatus

    @property
    def accelerated(self) -> bool:
        return self.path == ACCELERATOR


def choose_path(host_choice: str, platform: str, validation: ValidationStatus, confirmatory: bool,
                site_file: str = "<site configuration>") -> SamplerPath:
    """6.3: the path of one batch. ``platform``: JAX's default backend on this host ("gpu",
    "cpu", ...; "" when not asked). A registered (confirmatory) family's batch goes on the
    accelerator path only with a passed validation: forcing it otherwise is an InputError
    naming the fix."""
    if host_choice not in HOST_CHOICES:
        raise InputError(site_file, "power_sampler", "path", f"unknown path {host_choice!r}",
                         f"write one of {', '.join(HOST_CHOICES)}")
    if host_choice == "nutpie":
        return SamplerPath(NUTPIE_LOOP, "the host chose the nutpie loop", validation)
    if host_choice == "auto":
        if platform != "gpu":
            return SamplerPath(NUTPIE_LOOP, f"no GPU reported (JAX backend {platform or 'not asked'})", validation)
        if not validation.passed:
            return SamplerPath(NUTPIE_LOOP, "a GPU is reported, but the accelerator path's validation has not "
                                            f"passed ({validation.as_text()})", validation)
        return SamplerPath(ACCELERATOR, "a GPU is reported and the validation passed", validation)
    if confirmatory and not validation.passed:
        raise InputError(site_file, "power_sampler", "path",
                         "the accelerator path is forced for a registered family, but its validation has not passed "
                         f"({validation.as_text()})",
                         "point power_sampler.validation at a passing `benchmarks/power_gpu.py validate` run of the "
                         "registered simulation_sampler, or set power_sampler.path to auto or nutpie")
    return SamplerPath(ACCELERATOR, f"the host forced the accelerator path (JAX backend {platform or 'not asked'})",
                       validation)
