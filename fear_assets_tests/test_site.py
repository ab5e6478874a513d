"""The site configuration (what one host sets) is validated where it is read, names the field
and the fix, and is not part of the registered settings or their hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from fear_assets.core.settings import REGISTERED_SETTINGS_PATH, load_settings
from fear_assets.core.site import SITE_ENV, SiteConfig, SiteError, load_site, site_path

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "site.example.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_example_loads_against_the_registered_checkpoints():
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    site = load_site(EXAMPLE, registered_checkpoints=settings.models)
    assert site.checkpoint_dir("Qwen/Qwen2.5-7B-Instruct") == Path("/models/qwen2.5-7b-instruct")
    assert site.device == "cuda" and site.pools["gpu"] == 1 and site.pack_tokens == 4096
    # The example's directories are not on this machine: said, not silently ignored.
    assert "Qwen/Qwen2.5-7B-Instruct" in site.missing_checkpoints()


def test_no_file_gives_the_defaults(monkeypatch):
    monkeypatch.delenv(SITE_ENV, raising=False)
    assert site_path() is None
    assert load_site() == SiteConfig()


def test_the_environment_variable_names_the_file(tmp_path, monkeypatch):
    path = _write(tmp_path, "device: cpu\nretries: 0\n")
    monkeypatch.setenv(SITE_ENV, str(path))
    site = load_site()
    assert (site.device, site.retries, site.path) == ("cpu", 0, path)


def test_relative_checkpoint_paths_are_read_from_the_site_files_directory(tmp_path):
    (tmp_path / "weights").mkdir()
    site = load_site(_write(tmp_path, "checkpoints: {Qwen/Qwen2.5-7B: weights}\n"))
    assert site.checkpoint_dir("Qwen/Qwen2.5-7B") == (tmp_path / "weights").resolve()
    assert site.missing_checkpoints() == {}


@pytest.mark.parametrize("text, field, fix", [
    ("devise: cuda\n", "devise", "did you mean 'device'"),
    ("device: gpu\n", "device", "cuda"),
    ("engine: {generation_batch: 0}\n", "generation_batch", "at least 1"),
    ("pools: {gpus: 2}\n", "gpus", "did you mean 'gpu'"),
    ("store: {kind: sqlite}\n", "kind", "duckdb, parquet"),
    ("automation: yes please\n", "automation", "true"),
    ("retries: -1\n", "retries", "at least 0"),
    ("checkpoints: [a, b]\n", "checkpoints", "checkpoints: {"),
    # The store's DuckDB path is a file, its Parquet root a directory: the fix says which.
    ("store: {kind: duckdb, duckdb_path: 3}\n", "duckdb_path", "write the file as a string"),
    ("store: {kind: parquet, parquet_root: 3}\n", "parquet_root", "write the directory as a string"),
])
def test_a_bad_field_is_named_with_its_fix(tmp_path, text, field, fix):
    path = _write(tmp_path, text)
    with pytest.raises(SiteError) as err:
        load_site(path)
    assert err.value.field == field and fix in err.value.fix and str(path) in str(err.value)


def test_a_checkpoint_the_protocol_does_not_register_is_refused_with_the_closest_name(tmp_path):
    settings = load_settings(REGISTERED_SETTINGS_PATH)
    path = _write(tmp_path, "checkpoints: {Qwen/Qwen2.5-7B-Instuct: /models/q}\n")
    with pytest.raises(SiteError) as err:
        load_site(path, registered_checkpoints=settings.models)
    assert "did you mean 'Qwen/Qwen2.5-7B-Instruct'" in err.value.fix


def test_a_missing_or_non_utf8_file_says_what_to_do(tmp_path):
    with pytest.raises(SiteError, match="deploy/site.example.yaml"):
        load_site(tmp_path / "absent.yaml")
    bad = tmp_path / "site.yaml"
    bad.write_bytes(b"device: cpu # caf\xe9\n")
    with pytest.raises(SiteError, match="re-save the file as UTF-8"):
        load_site(bad)
