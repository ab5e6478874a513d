"""How this host fits power-simulation batches (the site's ``power_sampler``): the path it
prefers, whether JAX reports a GPU, and its validation of the accelerator path. Wiring only:
the choice is ``simulation.sampler_path.choose_path``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg

from fear_assets.core.errors import InputError
from fear_assets.core.site import SiteConfig
from fear_assets.simulation.sampler_path import SamplerPath, ValidationStatus, choose_path, validation_status


class PowerSamplerResource(dg.ConfigurableResource):
    """The host's power-simulation path (``auto``, ``nutpie``, ``accelerator``) and the JSON of
    its validation of the accelerator path ("" = none). Never part of the registered record."""

    path: str = "auto"
    validation_file: str = ""
    #: The site file these came from ("" = none), named in an error.
    site_file: str = ""

    @classmethod
    def from_site(cls, site: SiteConfig) -> "PowerSamplerResource":
        v = site.power_sampler.validation
        return cls(path=site.power_sampler.path, validation_file=str(v) if v is not None else "",
                   site_file=str(site.path) if site.path is not None else "")

    def platform(self) -> str:
        """JAX's default backend on this host ("gpu", "cpu", ...); not asked (JAX not loaded)
        when the host chose the nutpie loop."""
        if self.path == "nutpie":
            return ""
        import jax

        return str(jax.default_backend())

    def validation(self, sampler) -> ValidationStatus:
        """The status of this host's validation file for the registered simulation ``sampler``."""
        if not self.validation_file:
            return validation_status(None, sampler)
        file = Path(self.validation_file)
        try:
            raw = file.read_bytes()
            record = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise InputError(self.site_file or "<site configuration>", "power_sampler", "validation",
                             f"cannot read the validation file {file} ({exc})",
                             "point it at the JSON a `benchmarks/power_gpu.py validate` run wrote, or remove the key") from exc
        return validation_status(record, sampler, str(file), hashlib.sha256(raw).hexdigest())

    def route(self, sampler, confirmatory: bool) -> SamplerPath:
        """The path of one batch of a family in ``confirmatory`` mode or not."""
        return choose_path(self.path, self.platform(), self.validation(sampler), confirmatory,
                           self.site_file or "<site configuration>")
