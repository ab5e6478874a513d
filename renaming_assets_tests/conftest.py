"""Shared fixtures: the full registered bundle (built once per session), a reduced-cohort
bundle for fast failure tests, and their synthetic logs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from renaming_assets.bundle import PLAN, build_bundle, read_plan
from renaming_assets.settings import SETTINGS
from renaming_assets.synthetic import write_synthetic_log

#: A reduced cohort for fast tests (multiple of four for the balanced cycles, even for the
#: mirrored pairs). Not the registered study.
SMALL = dataclasses.replace(SETTINGS, cohort=dataclasses.replace(SETTINGS.cohort, worlds_per_family=4))


@pytest.fixture(scope="session")
def full_bundle(tmp_path_factory) -> Path:
    """The registered bundle, built once (generate, audit, precision, freeze)."""
    out = tmp_path_factory.mktemp("full") / "bundle"
    build_bundle(out, SETTINGS)
    return out


@pytest.fixture(scope="session")
def full_plan(full_bundle) -> list[dict]:
    return read_plan(full_bundle / PLAN)


@pytest.fixture(scope="session")
def full_audit(full_bundle) -> dict:
    return json.loads((full_bundle / "audit.json").read_text())


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("small") / "bundle"
    build_bundle(out, SMALL)
    return out


@pytest.fixture(scope="session")
def small_plan(small_bundle) -> list[dict]:
    return read_plan(small_bundle / PLAN)


@pytest.fixture(scope="session")
def small_log(small_bundle, tmp_path_factory) -> Path:
    return write_synthetic_log(small_bundle / PLAN, tmp_path_factory.mktemp("logs") / "synthetic.jsonl", SMALL)
