"""Shared fixtures: the registered settings and bank, the embedded tokenizer, bank copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fear_assets.lm.tokenizers import load_tokenizer
from fear_assets.core.settings import DEFAULT_BANK_DIR, load_settings
from fear_assets.stimuli.bank import load_bank

EMBEDDED = "smollm2-135m"
PRIMARY = "qwen2.5-7b"


@pytest.fixture(scope="session")
def settings():
    return load_settings()


@pytest.fixture(scope="session")
def bank(settings):
    return load_bank(DEFAULT_BANK_DIR, settings)


@pytest.fixture(scope="session")
def smol_tokenizer(settings, tmp_path_factory):
    # A private cache so the test does not depend on (or write into) the project's data/cache.
    return load_tokenizer(settings.family(EMBEDDED).tested, tmp_path_factory.mktemp("cache"))


@pytest.fixture
def bank_copy(tmp_path) -> Path:
    """A writable copy of the registered bank, for edits that must fail validation."""
    target = tmp_path / "bank"
    shutil.copytree(DEFAULT_BANK_DIR, target)
    return target


#: Seconds each test module took in a full run (``scripts/test_durations.py`` writes it from a
#: ``--durations=0`` log). Only the order of the modules depends on it, never a result.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(session, config, items):
    """The longest modules first (by their recorded durations; unrecorded ones after, in file
    order): a serial run follows it, and so do xdist's workers under ``--no-loadscope-reorder``
    (scripts/fear), so that no long module starts last and leaves one worker idle at the end."""
    if not DURATIONS.is_file():
        return
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    order = {path: i for i, path in enumerate(dict.fromkeys(item.nodeid.split("::")[0] for item in items))}
    items.sort(key=lambda item: (-float(seconds.get(item.nodeid.split("::")[0], 0.0)),
                                 order[item.nodeid.split("::")[0]]))


#: Modules that must never run beside each other under xdist: each starts a fleet of processes
#: (a Postgres server, dagster-daemon and a run per partition; ``dagster dev`` and Chromium)
#: and waits for it against a deadline, so two of them together on 2 cores starve each other
#: (measured: the Postgres backfill timed out beside the browser test, 1 failed in 545 s).
#: They share one work unit, so one worker runs them one after the other.
APART = ("fear_assets_tests/test_store_concurrency.py", "fear_assets_tests/test_browser.py")


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadfile schedule (one module per work unit, module fixtures built once), with
    the ``APART`` modules joined into one unit. Any other ``--dist`` keeps xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ApartLoadFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return APART[0] if scope in APART else scope

    return ApartLoadFileScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
    """The fault suite's ledger as JSON when ``$FEAR_FAULTS_REPORT`` names a file (issue 16)."""
    import os

    from fear_assets_tests.faults import LEDGER, REPORT_ENV, write_report

    if os.environ.get(REPORT_ENV) and LEDGER:
        write_report(os.environ[REPORT_ENV], LEDGER)
