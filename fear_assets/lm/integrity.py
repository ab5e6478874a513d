"""The model directory against its manifest (protocol 4.1, Appendix B; D6): every weight,
config and tokenizer file's sha256 as the model manifest recorded it. A file changed,
missing or added is named, with what to do; scoring a checkpoint that differs from its
manifest would score another model under the registered one's name."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from fear_assets.core.errors import FreezeError
from fear_assets.core.hashing import sha256_file


class ModelIntegrityError(FreezeError):
    """A model directory whose files differ from the model manifest."""


def model_file_differences(directory: str | Path, expected: Mapping[str, str]) -> list[str]:
    """Each file of ``directory`` whose sha256 differs from ``expected`` (path -> sha256), or
    that is missing or not in the manifest (hidden files are not part of a checkpoint)."""
    directory = Path(directory)
    now = {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*"))
           if p.is_file() and not p.name.startswith(".")}
    out = [f"{name}: missing" for name in sorted(set(expected) - set(now))]
    out += [f"{name}: not in the manifest" for name in sorted(set(now) - set(expected))]
    out += [f"{name}: sha256 {sha256_file(now[name])[:12]}..., manifest {expected[name][:12]}..."
            for name in sorted(set(now) & set(expected)) if sha256_file(now[name]) != expected[name]]
    return out


def verify_model_directory(directory: str | Path, expected: Mapping[str, str], checkpoint: str = "") -> None:
    """Raise :class:`ModelIntegrityError` naming every file that differs from the manifest."""
    diffs = model_file_differences(directory, expected)
    if diffs:
        raise ModelIntegrityError(
            f"model {checkpoint or directory} at {directory} differs from its model manifest: {'; '.join(diffs)}. "
            "Fix: restore the registered checkpoint's files (re-copy them from the source whose sha256 the "
            "registration record lists), or re-materialise model_manifest and file an amendment if the change is "
            "deliberate")


def manifest_files(model_manifest, checkpoint: str) -> dict[str, str]:
    """The files (path -> sha256) the stored model manifest lists for ``checkpoint`` (the
    packaged source files, named ``source:...``, are not in the model directory)."""
    rows = model_manifest[(model_manifest["checkpoint"] == checkpoint) & (model_manifest["file"] != "")]
    return {str(r.file): str(r.sha256) for r in rows.itertuples() if not str(r.file).startswith("source:")}
