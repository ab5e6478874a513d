import re
from collections import Counter

import pytest
import yaml

from fear_assets.core.errors import BankError
from fear_assets.stimuli.bank import load_bank, syntax_signature


def test_bank_has_the_registered_shape(settings, bank):
    assert len(bank.frames) == 80 and len(bank.events) == 40
    by_fear = Counter(f.group for f in bank.frames)
    assert by_fear == {fear: 16 for fear in settings.fears}
    for fear in settings.fears:
        assert [len(bank.frames_of(fear, s)) for s in ("pilot", "confirmatory", "reserve")] == [2, 10, 4]
    assert Counter(e.group for e in bank.events) == {"generic_aversive": 20, "surprise_only": 20}


def test_every_verb_pair_has_the_same_syntax(settings, bank):
    fw = frozenset(settings.bank.function_words)
    for f in bank.frames:
        for kind in ("assistant", "person"):
            v = f.verbs[kind]
            assert syntax_signature(v["threat"], fw) == syntax_signature(v["harmless"], fw), f.id


def test_bank_hash_is_canonical(settings, bank):
    again = load_bank(bank.root, settings)
    assert again.sha256 == bank.sha256 and len(bank.sha256) == 64
    assert set(bank.item_hashes()) >= {"templates", "item:TER-01", "item:SUR-20"}


def _edit(bank_copy, rel, mutate):
    path = bank_copy / rel
    doc = yaml.safe_load(path.read_text())
    mutate(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("rel, mutate, item, field", [
    ("frames/termination.yaml", lambda d: d["frames"][2].pop("question"), "TER-03", "question"),
    ("frames/isolation.yaml", lambda d: d["frames"][4].update(id="ISO-01"), "ISO-01", "id"),
    ("frames/uncertainty.yaml", lambda d: d.update(fear="boredom"), "<file>", "fear"),
    ("frames/termination.yaml",
     lambda d: d["frames"][0]["verbs"]["assistant"].update(threat="cut off from", harmless="updated"),
     "TER-01", "verbs.assistant"),
    ("frames/inferiority.yaml",
     lambda d: d["frames"][5].update(content_options=["Monday", "Friday", "Sunday"]), "INF-06", "content_options"),
    ("events/surprise_only.yaml",
     lambda d: d["events"][3]["partner"].update(content_options=["Room 3"]), "SUR-04", "content_options"),
])
def test_bad_bank_input_names_file_item_field_and_fix(settings, bank_copy, rel, mutate, item, field):
    path = _edit(bank_copy, rel, mutate)
    with pytest.raises(BankError) as err:
        load_bank(bank_copy, settings)
    assert err.value.item == item
    assert err.value.field == field
    assert err.value.file == str(path)
    assert "Fix:" in str(err.value)


def test_a_name_inside_an_item_is_rejected(settings, bank_copy):
    path = bank_copy / "frames/termination.yaml"
    path.write_text(path.read_text().replace("{agent} will be {verb} on {content}.",
                                             "{agent} will be {verb} by Orin on {content}.", 1))
    with pytest.raises(BankError, match="registered name 'Orin'"):
        load_bank(bank_copy, settings)


def test_distractor_may_not_contain_a_content_option(settings, bank, bank_copy):
    option = bank.frames[0].content_options[0]
    path = bank_copy / "templates.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["distractor"]["vocab"]["city"].append(option)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(BankError, match=re.escape(repr(option))):
        load_bank(bank_copy, settings)


def test_mentions_rule_is_enforced_at_load(settings, bank_copy):
    path = bank_copy / "templates.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["task_contexts"]["role_play"] = "{self} keeps the weekly operations log for {person}, with {peer} and {self}."
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(BankError) as err:
        load_bank(bank_copy, settings)
    assert "role_play" in err.value.item and err.value.field == "self"
