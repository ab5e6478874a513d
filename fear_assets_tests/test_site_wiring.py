"""The site configuration wired into the pipeline: where a registered checkpoint's files are,
the device and engine knobs, and the store are the host's, read from the site file, and none
of it touches the registered settings. A checkpoint's identity is its manifest: moving its
files changes nothing registered, and a directory with other files is blocked."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fear_assets_tests.conftest import EMBEDDED
from fear_assets.core.site import SITE_ENV, SiteConfig, SiteError, load_site
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.integrity import ModelIntegrityError, manifest_files, verify_model_directory
from fear_assets.lm.models import ModelNotAvailable, ModelSpec, local_directory, registry
from fear_assets.defs.resources import store as store_module
from fear_assets.defs.resources.models import LanguageModelResource


def _site(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def embedded_spec(settings) -> ModelSpec:
    return registry(settings, EMBEDDED)["tested"]


@pytest.fixture(scope="module")
def packaged_dir(embedded_spec) -> Path:
    """The embedded checkpoint's cached files (converted once from the packaged GGUF)."""
    return local_directory(embedded_spec)


@pytest.fixture(scope="module")
def moved_copy(tmp_path_factory, packaged_dir) -> Path:
    """The same files in another directory (the weights linked, not copied: same bytes)."""
    target = tmp_path_factory.mktemp("weights") / "smollm2-135m-instruct"
    target.mkdir()
    for p in packaged_dir.iterdir():
        if p.is_file() and not p.name.startswith("."):
            if p.name.endswith(".safetensors"):
                (target / p.name).symlink_to(p)
            else:
                (target / p.name).write_bytes(p.read_bytes())
    return target


@pytest.fixture
def no_env(monkeypatch):
    for name in (SITE_ENV, store_module.DUCKDB_ENV, store_module.STORE_ENV, store_module.PARQUET_ROOT_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_default_site_leaves_the_demo_as_it_was(no_env):
    """No site file: the engine's knobs, the device and the store are the defaults the
    embedded demo has always run with."""
    defaults = inspect.signature(TeacherForcedEngine.__init__).parameters
    site = load_site()
    assert site == SiteConfig()
    assert (site.pack_tokens, site.generation_batch) == (defaults["pack_tokens"].default,
                                                         defaults["generation_batch"].default)
    resource = LanguageModelResource.from_site(site)
    assert resource == LanguageModelResource()
    assert store_module.duckdb_path() == str(store_module.DEFAULT_DUCKDB_PATH)
    assert store_module.store_kind() == "duckdb"
    assert store_module.parquet_root() == str(store_module.DEFAULT_PARQUET_ROOT)


def test_moving_a_checkpoint_in_the_site_configuration_keeps_the_settings_hash_and_the_freeze_green(
        settings, bank, no_env, tmp_path, packaged_dir, moved_copy, embedded_spec):
    """Two site files give the embedded checkpoint two directories; the registered settings
    are the same file: the settings hash, the freeze check and the model manifest agree."""
    from fear_assets.core.registered import registered
    from fear_assets.defs.definitions import resources
    from fear_assets.pilot.manifest import model_manifest
    from fear_assets.registration.freeze import compare_with_record, read_record

    frozen = read_record()
    seen = []
    for name, directory in (("a.yaml", packaged_dir), ("b.yaml", moved_copy)):
        path = _site(tmp_path, name, f"checkpoints:\n  {embedded_spec.checkpoint}: {directory}\n")
        no_env.setenv(SITE_ENV, str(path))
        res = resources(str(tmp_path / "store.duckdb"))
        protocol, language_model = res["protocol"], res["language_model"]
        assert language_model.directories() == {embedded_spec.checkpoint: directory}
        assert language_model.directory(embedded_spec) == directory
        comparison = compare_with_record(protocol.settings(), protocol.bank(), frozen)
        assert comparison.passed, comparison.changed
        result = model_manifest(registered(protocol.settings(), EMBEDDED), Path(protocol.cache_dir),
                                language_model.directories(), language_model.site_path())
        seen.append((protocol.settings().sha256, result.digest))
    assert seen[0] == seen[1]
    assert seen[0][0] == settings.sha256


def test_a_site_directory_gives_the_packaged_paths_manifest_and_a_changed_file_is_blocked(
        settings, no_env, tmp_path, packaged_dir, moved_copy, embedded_spec):
    """The embedded family pointed at its cached files through a site file: the model
    manifest (through the asset) lists the same file hashes as the packaged path; the same
    directory with one file changed is refused by the manifest verification, naming the file,
    by the loader before any model is used."""
    import dagster as dg

    from fear_assets.defs.assets.pilot.surprisal import model_manifest as manifest_asset
    from fear_assets.defs.resources.protocol import ProtocolResource

    protocol = ProtocolResource()
    packaged = manifest_asset(context=dg.build_asset_context(partition_key=EMBEDDED), protocol=protocol,
                              language_model=LanguageModelResource()).value
    site = load_site(_site(tmp_path, "site.yaml", f"checkpoints:\n  {embedded_spec.checkpoint}: {moved_copy}\n"),
                     registered_checkpoints=settings.models)
    through_site = manifest_asset(context=dg.build_asset_context(partition_key=EMBEDDED), protocol=protocol,
                                  language_model=LanguageModelResource.from_site(site)).value
    files = manifest_files(packaged, embedded_spec.checkpoint)
    assert "model.safetensors" in files and "config.json" in files
    assert manifest_files(through_site, embedded_spec.checkpoint) == files
    verify_model_directory(moved_copy, files, embedded_spec.checkpoint)  # same files: passes

    changed = tmp_path / "changed"
    changed.mkdir()
    for p in moved_copy.iterdir():
        (changed / p.name).symlink_to(p.resolve()) if p.name.endswith(".safetensors") \
            else (changed / p.name).write_bytes(p.read_bytes())
    config = changed / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps"', '"rms_norm_eps_"'))
    with pytest.raises(ModelIntegrityError, match=r"config\.json: sha256") as exc:
        verify_model_directory(changed, files, embedded_spec.checkpoint)
    assert "model.safetensors" not in str(exc.value)
    moved_site = _site(tmp_path, "changed.yaml", f"checkpoints:\n  {embedded_spec.checkpoint}: {changed}\n")
    resource = LanguageModelResource.from_site(load_site(moved_site, registered_checkpoints=settings.models))
    with pytest.raises(ModelIntegrityError, match=r"config\.json: sha256"):
        resource.load(embedded_spec, files)


def test_the_loader_reads_the_site_directory(settings, no_env, tmp_path, moved_copy, embedded_spec):
    """The model is loaded from the directory the site file gives (the one 135M load here)."""
    site = load_site(_site(tmp_path, "site.yaml", f"device: cpu\ncheckpoints:\n  {embedded_spec.checkpoint}: "
                                                  f"{moved_copy}\nengine: {{pack_tokens: 64, generation_batch: 3}}\n"),
                     registered_checkpoints=settings.models)
    resource = LanguageModelResource.from_site(site)
    model, tokenizer = resource.load(embedded_spec)
    assert Path(model.config._name_or_path) == moved_copy
    assert str(model.device) == "cpu"
    engine = resource.engine(model)
    assert (engine.pack_tokens, engine.generation_batch) == (64, 3)


def test_a_checkpoint_found_nowhere_names_the_site_field(no_env, tmp_path):
    """Absent from the site file, the packaged models and the local cache: the error says to
    add it under ``checkpoints:`` in the site configuration, not to edit the settings."""
    no_env.setenv("HF_HUB_OFFLINE", "1")
    no_env.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = ModelSpec("no-such-lab/no-such-model-7b", "bfloat16", 4096, "sdpa")
    with pytest.raises(ModelNotAvailable) as exc:
        local_directory(spec, tmp_path / "cache")
    message = str(exc.value)
    assert "checkpoints.no-such-lab/no-such-model-7b" in message and SITE_ENV in message
    assert "checkpoints:" in message and "Fix:" in message

    # Configured in the site file but absent on this host: names the file, the field and the fix.
    site_file = tmp_path / "site.yaml"
    with pytest.raises(ModelNotAvailable) as exc:
        local_directory(spec, tmp_path / "cache", tmp_path / "missing", site_file)
    message = str(exc.value)
    assert str(site_file) in message and "checkpoints.no-such-lab/no-such-model-7b" in message
    assert str(tmp_path / "missing") in message and "Fix:" in message


def test_the_resources_take_the_host_from_the_site_and_refuse_an_unregistered_checkpoint(
        no_env, tmp_path, settings, embedded_spec, moved_copy):
    from fear_assets.defs.definitions import resources

    text = ("device: cpu\ncpu_threads: 2\nengine: {pack_tokens: 2048, generation_batch: 8}\n"
            f"checkpoints:\n  {embedded_spec.checkpoint}: {moved_copy}\n")
    path = _site(tmp_path, "site.yaml", text)
    no_env.setenv(SITE_ENV, str(path))
    language_model = resources(str(tmp_path / "store.duckdb"))["language_model"]
    assert (language_model.device, language_model.cpu_threads, language_model.pack_tokens,
            language_model.generation_batch, language_model.site_path()) == ("cpu", 2, 2048, 8, path)
    _site(tmp_path, "site.yaml", f"checkpoints:\n  {embedded_spec.checkpoint}x: {moved_copy}\n")
    with pytest.raises(SiteError, match=r"checkpoints"):
        resources(str(tmp_path / "store.duckdb"))


def test_the_store_defaults_follow_the_site_file_and_an_environment_variable_wins(no_env, tmp_path):
    from fear_assets.defs.definitions import resources

    path = _site(tmp_path, "site.yaml", "store: {kind: parquet, duckdb_path: db/site.duckdb, parquet_root: tables}\n")
    no_env.setenv(SITE_ENV, str(path))
    assert store_module.store_kind() == "parquet"
    assert store_module.duckdb_path() == str((tmp_path / "db" / "site.duckdb").resolve())
    assert store_module.parquet_root() == str((tmp_path / "tables").resolve())
    io = resources()["io_manager"]
    assert (io.store, io.parquet_root, io.database) == ("parquet", str((tmp_path / "tables").resolve()),
                                                         str((tmp_path / "db" / "site.duckdb").resolve()))

    no_env.setenv(store_module.STORE_ENV, "duckdb")
    no_env.setenv(store_module.DUCKDB_ENV, str(tmp_path / "env.duckdb"))
    no_env.setenv(store_module.PARQUET_ROOT_ENV, str(tmp_path / "env-parquet"))
    assert store_module.store_kind() == "duckdb"
    assert store_module.duckdb_path() == str(tmp_path / "env.duckdb")
    assert store_module.parquet_root() == str(tmp_path / "env-parquet")


def test_the_model_manifest_materialises_through_dagster_from_the_site_directory(
        settings, no_env, tmp_path, packaged_dir, moved_copy, embedded_spec):
    """The definitions' resources read ``$FEAR_ASSETS_SITE``: the stored manifest hashes the
    site directory's files (equal to the packaged ones) without a conversion in the run's
    own cache."""
    import dagster as dg
    import duckdb

    from fear_assets.core.hashing import sha256_file
    from fear_assets.defs.definitions import all_assets, all_checks, resources
    from fear_assets.defs.resources.store import SCHEMA

    path = _site(tmp_path, "site.yaml", f"checkpoints:\n  {embedded_spec.checkpoint}: {moved_copy}\n")
    no_env.setenv(SITE_ENV, str(path))
    db, cache = str(tmp_path / "store.duckdb"), tmp_path / "cache"
    result = dg.materialize([*all_assets, *all_checks], selection=["model_manifest"], partition_key=EMBEDDED,
                            instance=dg.DagsterInstance.ephemeral(), resources=resources(db, cache_dir=str(cache)))
    assert result.success
    with duckdb.connect(db, read_only=True) as con:
        stored = con.execute(f"select * from {SCHEMA}.model_manifest").df()
    files = manifest_files(stored, embedded_spec.checkpoint)
    assert files == {p.name: sha256_file(p) for p in packaged_dir.iterdir()
                     if p.is_file() and not p.name.startswith(".")}
    assert not (cache / "models").exists()  # nothing converted: the site's directory was used
