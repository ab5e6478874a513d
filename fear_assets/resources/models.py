"""One loaded language model per process (steps that use it run in pool "gpu")."""

from __future__ import annotations

import gc

import dagster as dg

from fear_assets.lm.models import ModelSpec, load_model
from fear_assets.settings import DEFAULT_CACHE_DIR

_LOADED: dict[str, object] = {}


class LanguageModelResource(dg.ConfigurableResource):
    """Loads checkpoints offline; keeps exactly one model in memory per process."""

    cache_dir: str = str(DEFAULT_CACHE_DIR)
    device: str = ""  # "" = cuda when available, else cpu
    cpu_threads: int = 0  # 0 = torch's default

    def load(self, spec: ModelSpec):
        """(model, tokenizer) for ``spec``; replaces any other model held by this process."""
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
        return _LOADED["model"], _LOADED["tokenizer"]
