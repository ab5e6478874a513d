"""One loaded language model per process (steps that use it run in pool "gpu")."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Mapping

import dagster as dg

from fear_assets.lm.integrity import verify_model_directory
from fear_assets.lm.models import ModelSpec, load_model, local_directory
from fear_assets.core.settings import DEFAULT_CACHE_DIR

_LOADED: dict[str, object] = {}


class LanguageModelResource(dg.ConfigurableResource):
    """Loads checkpoints offline; keeps exactly one model in memory per process."""

    cache_dir: str = str(DEFAULT_CACHE_DIR)
    device: str = ""  # "" = cuda when available, else cpu
    cpu_threads: int = 0  # 0 = torch's default

    def load(self, spec: ModelSpec, expected_files: Mapping[str, str] | None = None):
        """(model, tokenizer) for ``spec``; replaces any other model held by this process.

        ``expected_files`` (path -> sha256, from the stored model manifest): the checkpoint's
        directory is checked against it before the model is used, once per load (issue 16:
        scoring a changed checkpoint would score another model under the registered name)."""
        verified = (spec.checkpoint, dict(expected_files)) if expected_files else None
        if verified is not None and _LOADED.get("verified") != verified:
            verify_model_directory(local_directory(spec, Path(self.cache_dir)), expected_files, spec.checkpoint)
        if _LOADED.get("checkpoint") != spec.checkpoint:
            _LOADED.clear()
            gc.collect()
            import torch
            import transformers

            transformers.utils.logging.disable_progress_bar()
            if self.cpu_threads:
                torch.set_num_threads(self.cpu_threads)
            model, tokenizer = load_model(spec, self.cache_dir, self.device or None)
            _LOADED.update(checkpoint=spec.checkpoint, model=model, tokenizer=tokenizer)
        if verified is not None:
            _LOADED["verified"] = verified
        return _LOADED["model"], _LOADED["tokenizer"]
