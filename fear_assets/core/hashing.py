"""Canonical serialisation and sha256, the basis of every freeze check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def canonical_json(obj: Any) -> str:
    """One byte-stable text for any JSON-able value: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_obj(obj: Any) -> str:
    return sha256_text(canonical_json(obj))


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def derived_seed(master_seed: int, *parts: object) -> int:
    """A 63-bit seed derived from the registered master seed and a purpose path.

    Deterministic across processes and platforms (unlike ``hash()``), so every random draw
    is reproducible from the registered settings alone.
    """
    digest = hashlib.sha256(canonical_json([master_seed, *map(str, parts)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


#: Seeds handed to samplers (PyMC, nutpie) are 31-bit: their legacy bound.
SAMPLER_SEED_BOUND = 2**31


def sampler_seed(master_seed: int, *parts: object) -> int:
    """The seed of one sampler run: :func:`derived_seed` reduced to 31 bits. The one
    derivation every fit's seed comes from (``Registered.seed`` for a family's steps)."""
    return derived_seed(master_seed, *parts) % SAMPLER_SEED_BOUND


def write_inference_data(idata, path: str | Path) -> Path:
    """Write ArviZ InferenceData to netCDF without its ``created_at`` stamps, so the same draws
    give the same bytes and the sha256 stored beside the file is reproducible. The file is
    written beside ``path`` first and then renamed over it, so an interrupted write leaves no
    half-written file."""
    path = Path(path)
    for group in idata.groups():
        idata[group].attrs.pop("created_at", None)
    tmp = path.with_name(path.name + ".tmp")
    idata.to_netcdf(str(tmp))
    tmp.replace(path)
    return path
