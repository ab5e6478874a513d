"""The model manifest of one configuration (protocol 4.1, Appendix B)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pandas as pd

from fear_assets.core.registered import Registered
from fear_assets.lm.models import manifest, manifest_digest, registry


@dataclass(frozen=True)
class ManifestResult:
    """One row per role and file, the manifest's digest and the files per checkpoint."""

    table: pd.DataFrame
    digest: str
    shown: pd.DataFrame


def model_manifest(view: Registered, cache_dir: Path, directories: Mapping[str, Path] | None = None,
                   site_file: Path | None = None) -> ManifestResult:
    """Per role (tested, base, scorer, judge) the checkpoint, dtype, context window,
    attention implementation, the sha256 of every weight, config and tokenizer file and the
    library versions; a role without a checkpoint is one "not available" row. Weights are
    never downloaded: a missing model fails with what to place where. ``directories``
    (checkpoint -> directory, from the site configuration ``site_file``) are the ones the
    models are loaded from, so the manifest hashes the files actually scored."""
    family = view.family.key
    rows, seen = [], {}
    for role, spec in registry(view.settings, family).items():
        if spec is None:
            rows.append({"family": family, "role": role, "checkpoint": "not available", "file": "", "sha256": "",
                         "dtype": "", "context_window": 0, "attn_implementation": "", "versions": ""})
            continue
        if spec.checkpoint not in seen:
            seen[spec.checkpoint] = manifest(spec, cache_dir, (directories or {}).get(spec.checkpoint), site_file)
        m = seen[spec.checkpoint]
        for name, digest in {**m["files"], **{f"source:{k}": v for k, v in m["source_files"].items()}}.items():
            rows.append({"family": family, "role": role, "checkpoint": spec.checkpoint, "file": name, "sha256": digest,
                         "dtype": spec.dtype, "context_window": spec.context_window,
                         "attn_implementation": spec.attn_implementation, "versions": json.dumps(m["versions"])})
    table = pd.DataFrame(rows)
    shown = table.groupby(["role", "checkpoint"]).size().reset_index(name="files")
    return ManifestResult(table, manifest_digest(table), shown)
