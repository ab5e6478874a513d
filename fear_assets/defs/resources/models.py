"""One loaded language model per process (steps that use it run in pool "gpu")."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Mapping

import dagster as dg
from pydantic import Field

from fear_assets.core.site import SiteConfig
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.integrity import verify_model_directory
from fear_assets.lm.models import ModelSpec, load_model, local_directory
from fear_assets.core.settings import DEFAULT_CACHE_DIR

_LOADED: dict[str, object] = {}


class LanguageModelResource(dg.ConfigurableResource):
    """Loads checkpoints offline; keeps exactly one model in memory per process.

    Device, threads, checkpoint directories and engine knobs are the host's (the site
    configuration, ``core.site``; :meth:`from_site`), never the registered settings'."""

    cache_dir: str = str(DEFAULT_CACHE_DIR)
    device: str = ""  # "" = cuda when available, else cpu
    cpu_threads: int = 0  # 0 = torch's default
    #: Registered checkpoint name -> local directory (the site configuration's ``checkpoints``).
    checkpoint_dirs: dict[str, str] = Field(default_factory=dict)
    #: The site file those directories came from ("" = none), named in a missing-directory error.
    site_file: str = ""
    #: Engine throughput knobs (the site's ``engine``); scores do not depend on them.
    pack_tokens: int = 1024
    generation_batch: int = 16

    @classmethod
    def from_site(cls, site: SiteConfig, **config) -> "LanguageModelResource":
        """The resource a host's site configuration describes (``config``: e.g. ``cache_dir``;
        default the site's ``paths.cache_dir``, else the project's)."""
        if site.paths.cache_dir is not None:
            config = {"cache_dir": str(site.paths.cache_dir), **config}
        return cls(device=site.device, cpu_threads=site.cpu_threads,
                   checkpoint_dirs={name: str(p) for name, p in site.checkpoints.items()},
                   site_file=str(site.path) if site.path is not None else "",
                   pack_tokens=site.pack_tokens, generation_batch=site.generation_batch, **config)

    def directories(self) -> dict[str, Path]:
        """Checkpoint -> the directory this host loads it from (the site's ``checkpoints``)."""
        return {name: Path(p) for name, p in self.checkpoint_dirs.items()}

    def site_path(self) -> Path | None:
        return Path(self.site_file) if self.site_file else None

    def directory(self, spec: ModelSpec) -> Path:
        """The directory ``spec`` is loaded from on this host (site directory first)."""
        return local_directory(spec, Path(self.cache_dir), self.directories().get(spec.checkpoint), self.site_path())

    def engine(self, model) -> TeacherForcedEngine:
        """The scoring engine over ``model`` with this host's batch and packing budget."""
        return TeacherForcedEngine(model, pack_tokens=self.pack_tokens, generation_batch=self.generation_batch)

    def load(self, spec: ModelSpec, expected_files: Mapping[str, str] | None = None):
        """(model, tokenizer) for ``spec``; replaces any other model held by this process.

        ``expected_files`` (path -> sha256, from the stored model manifest): the checkpoint's
        directory is checked against it before the model is used, once per load (scoring a
        changed checkpoint would score another model under the registered name)."""
        verified = (spec.checkpoint, dict(expected_files)) if expected_files else None
        if verified is not None and _LOADED.get("verified") != verified:
            verify_model_directory(self.directory(spec), expected_files, spec.checkpoint)
        # A checkpoint given another directory is another load (the held model came from elsewhere).
        key = (spec.checkpoint, self.checkpoint_dirs.get(spec.checkpoint, ""))
        if _LOADED.get("checkpoint") != key:
            _LOADED.clear()
            gc.collect()
            import torch
            import transformers

            transformers.utils.logging.disable_progress_bar()
            if self.cpu_threads:
                torch.set_num_threads(self.cpu_threads)
            model, tokenizer = load_model(spec, self.cache_dir, self.device or None,
                                          self.directories().get(spec.checkpoint), self.site_path())
            _LOADED.update(checkpoint=key, model=model, tokenizer=tokenizer)
        if verified is not None:
            _LOADED["verified"] = verified
        return _LOADED["model"], _LOADED["tokenizer"]
