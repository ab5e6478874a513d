"""Shared fixtures: the registered settings and bank, the embedded tokenizer, bank copies."""

from __future__ import annotations

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


def pytest_sessionfinish(session, exitstatus):
    """The fault suite's ledger as JSON when ``$FEAR_FAULTS_REPORT`` names a file (issue 16)."""
    import os

    from fear_assets_tests.faults import LEDGER, REPORT_ENV, write_report

    if os.environ.get(REPORT_ENV) and LEDGER:
        write_report(os.environ[REPORT_ENV], LEDGER)
