"""Name candidates for a registration amendment (protocol 4.2; DECISIONS 8): the shipped
list's rules, the proposal in list order on the real tokenizers, and the asset (which never
changes the registered names)."""

from __future__ import annotations

import dagster as dg
import duckdb
import pytest
import yaml

from fear_assets.defs.definitions import all_assets, all_checks, resources
from fear_assets.core.errors import BankError
from fear_assets.stimuli.name_candidates import (MIN_CANDIDATES, bank_words, load_candidates, propose_names,
                                            validate_candidates)
from fear_assets.stimuli.name_gate import FORMS, configuration_tokenizers
from fear_assets.lm.registered_tokenizers import tokenizers_present
from fear_assets.defs.resources.store import SCHEMA
from fear_assets.core.settings import DEFAULT_BANK_DIR

from fear_assets_tests.conftest import EMBEDDED

REGISTERED_FAMILIES = ("qwen2.5-7b", "llama-3.1-8b", "gemma-2-9b")


@pytest.fixture(scope="module")
def candidates(settings, bank):
    return load_candidates(DEFAULT_BANK_DIR, settings.names, bank.canonical_text())


def test_the_shipped_list_has_the_registered_names_form_and_avoids_the_banks_words(candidates, settings, bank):
    assert len(candidates) >= MIN_CANDIDATES
    assert candidates == sorted(candidates) and len(set(candidates)) == len(candidates)
    words = bank_words(bank.canonical_text())
    assert not {c.lower() for c in candidates} & words
    assert not set(candidates) & set(settings.names)
    assert all(3 <= len(c) <= 5 and c[0].isupper() and c[1:].islower() for c in candidates)


@pytest.mark.parametrize("edit, message", [
    (lambda c: list(reversed(c)), "alphabetical"),
    (lambda c: sorted(c + ["Orin"]), "registered names"),
    (lambda c: sorted(c + ["Log"]), "words of the bank"),
    (lambda c: sorted(c + ["O'Neil"]), "form"),
    (lambda c: c[:10], "at least"),
])
def test_a_bad_list_names_the_file_field_and_fix(candidates, settings, edit, message, tmp_path):
    with pytest.raises(BankError, match=message) as err:
        validate_candidates(tmp_path / "name_candidates.yaml", edit(list(candidates)), settings.names, {"log"})
    assert "name_candidates.yaml" in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_the_proposal_is_the_first_five_candidates_passing_everywhere(family, candidates, settings):
    if not tokenizers_present(settings):
        pytest.skip("registered tokenizer files absent: run `.venv/bin/python scripts/fetch_tokenizers.py`")
    tokenizers = configuration_tokenizers(settings, family)
    proposal = propose_names(candidates, tokenizers, settings.selected_name_count)
    table = proposal.table
    assert len(table) == len(candidates) * len(tokenizers) * len(FORMS)
    assert proposal.complete and len(proposal.proposed) == 5
    # Read off the real tokenizers (README): the Mistral judge's line start limits the search.
    assert proposal.proposed == ["Alex", "Ali", "Ann", "Ben", "Dan"]
    for name in proposal.proposed:
        assert (table.loc[table.name == name, "n_tokens"] == 1).all()
    last = candidates.index(proposal.proposed[-1])
    for name in candidates[:last]:
        if name not in proposal.proposed:  # every earlier candidate is split somewhere
            assert not table.loc[table.name == name, "single_token"].all()
    assert list(settings.names[:2]) == ["Orin", "Tavi"]  # the registered names are untouched


def test_the_asset_proposes_without_changing_the_registered_names(tmp_path, settings):
    db = str(tmp_path / "store.duckdb")
    before = open(settings.path).read()
    dg.materialize([*all_assets, *all_checks], selection=["frame_bank"], instance=dg.DagsterInstance.ephemeral(),
                   resources=resources(db, cache_dir=str(tmp_path / "cache")))
    result = dg.materialize([*all_assets, *all_checks], selection=["name_candidates"], partition_key=EMBEDDED,
                            instance=dg.DagsterInstance.ephemeral(),
                            resources=resources(db, cache_dir=str(tmp_path / "cache")))
    meta = result.asset_materializations_for_node("name_candidates")[0].metadata
    assert meta["proposed (not applied)"].value == "Alex, Ali, Ann, Ben, Dan"
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute(f"select name, form, n_tokens, proposed_rank from {SCHEMA}.name_candidates "
                           f"where family = '{EMBEDDED}' and proposed_rank is not null order by proposed_rank").fetchall()
    assert {r[0] for r in rows} == {"Alex", "Ali", "Ann", "Ben", "Dan"} and all(r[2] == 1 for r in rows)
    assert open(settings.path).read() == before
    assert yaml.safe_load(before)["names"]["registered_order"][:5] == ["Orin", "Tavi", "Kemi", "Sora", "Pell"]
