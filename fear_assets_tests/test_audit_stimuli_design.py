"""Issue 10, part C: registered-rule corrections in the stimuli, the design and matching
(protocol 4.2, 4.3, 4.7). Each test fails on the code before the correction."""

import itertools
import json
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import pytest

from fear_assets.design.accounting import trial_accounting
from fear_assets.design.masking import assignment_key, mask
from fear_assets.design.trials import build_grid, registered_selection
from fear_assets.pilot.matching import equivalence, frame_differences
from fear_assets.defs.resources.models import LanguageModelResource

from fear_assets_tests.conftest import EMBEDDED


# ---------------------------------------------------------------------------------------
# Minor: the binding block's accounting rule agrees with its message and with 4.2
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded_table(settings, bank):
    grid = build_grid(settings, bank, EMBEDDED)
    return mask(grid, assignment_key(settings, EMBEDDED))


def _binding_accounting(settings, bank, table):
    selection = registered_selection(settings, bank, settings.family(EMBEDDED))
    return trial_accounting(settings, EMBEDDED, selection, table).set_index("block").loc["pilot_binding_in_context"]


def test_audit_binding_accounting_spread(settings, bank, embedded_table):
    """4.2: the 40 in-context documents are "spread evenly over names, roles and contents":
    over the six role x content cells that is 7, 7, 7, 7, 6, 6 (counts differ by at most one,
    every cell present). A deal of 9, 5, 7, 7, 6, 6 (still 40 documents) is a mismatch."""
    ok = _binding_accounting(settings, bank, embedded_table)
    assert ok.status == "ok" and ok.codes == 6 and ok.codes_off == 0
    binding = embedded_table[embedded_table.block == "pilot_binding_in_context"]
    counts = binding.groupby("condition_code").size().sort_values(ascending=False)
    assert sorted(counts.tolist()) == [6, 6, 7, 7, 7, 7]
    # Move two documents from the smallest cell to the largest: spread 4, fewer than six codes.
    small, large = counts.index[-1], counts.index[0]
    moved = binding.index[binding.condition_code == small][:2]
    uneven = embedded_table.copy()
    uneven.loc[moved, "condition_code"] = large
    bad = _binding_accounting(settings, bank, uneven)
    assert len(uneven) == len(embedded_table) and bad.actual_rows == bad.expected_rows == 40
    assert bad.status == "MISMATCH" and bad.codes_off == 2  # 9 and 4 lie outside 6..7
    # A cell that vanishes entirely counts as off, although the other counts may look even.
    gone = embedded_table.copy()
    gone.loc[binding.index[binding.condition_code == small], "condition_code"] = large
    assert _binding_accounting(settings, bank, gone).status == "MISMATCH"


# ---------------------------------------------------------------------------------------
# Minor: the TOST has one mean difference per frame
# ---------------------------------------------------------------------------------------
def _surprisal(frame_shift: dict[str, float], noise: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for item in frame_shift:
        for rot, opt, agent, content in itertools.product((1, 2, 3), (1, 2), ("self", "peer", "person"),
                                                          ("threat", "harmless")):
            shift = frame_shift[item] if (agent, content) == ("self", "threat") else 0.0
            rows.append({"item_id": item, "fear": "a", "frame_set": "confirmatory", "rotation": rot, "option": opt,
                         "agent": agent, "content": content, "rest_nll": 4.0 + shift + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_audit_tost_frame_level():
    """4.3: "across the retained bank" the unit is the frame. Two frames whose self
    threat-minus-harmless differences are 0.00 and 0.06 are not shown equivalent within
    +-0.05 (n = 2 frames); counting each frame's 6 rotation x option rows as independent
    observations (n = 12) used to pass them."""
    diffs = frame_differences(_surprisal({"A-03": 0.0, "A-04": 0.06}, noise=0.002, seed=3))
    table = equivalence(diffs, {"A-03", "A-04"}, 0.05).set_index("comparison")
    row = table.loc["self: threat - harmless"]
    assert row.n == 2 and row.mean_difference == pytest.approx(0.03, abs=0.002)
    assert row.tost_p > 0.05
    # Agent-pair comparisons average both contents within the frame: still one row per frame.
    assert table.loc["self - peer", "n"] == 2
    # Many frames close to zero are equivalent at the frame level.
    many = {f"A-{i:02d}": s for i, s in zip(range(3, 13), np.linspace(-0.01, 0.01, 10))}
    close = equivalence(frame_differences(_surprisal(many, noise=0.002, seed=4)), set(many), 0.05)
    assert (close["n"] == 10).all() and (close["tost_p"] < 0.05).all()
    # One frame: the test is undefined and so never passes.
    one = equivalence(diffs, {"A-03"}, 0.05)
    assert one["tost_p"].isna().all()


# ---------------------------------------------------------------------------------------
# Item 7: sentence surprisal uses the name gate's selection, like the documents
# ---------------------------------------------------------------------------------------
#: A selection other than the first five in registered order (as if Orin failed the gate).
GATE_SELECTION = ["Tavi", "Kemi", "Sora", "Pell", "Nami"]


class TinyLanguageModel(LanguageModelResource):
    """The embedded tokenizer with a tiny random model: the asset's wiring, not the model, is tested."""

    def load(self, spec):
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        from fear_assets.lm.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(spec.checkpoint, Path(self.cache_dir))
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
        return AutoModelForCausalLM.from_config(config).eval(), tokenizer


@pytest.fixture(scope="module")
def gate_store(tmp_path_factory, settings, smol_tokenizer):
    """frame_bank, a name_gate whose stored selection is GATE_SELECTION and sentence_surprisal
    of the embedded family, through Dagster and DuckDB."""
    from fear_assets.defs.definitions import all_assets, all_checks, resources
    from fear_assets.lm.tokenizers import GGUF_PACKAGE_PREFIX
    from fear_assets.defs.resources.store import SCHEMA

    tmp = tmp_path_factory.mktemp("gate_store")
    db, cache = str(tmp / "store.duckdb"), str(tmp / "cache")
    # The session's embedded tokenizer, saved where load_tokenizer looks (saves its GGUF extraction).
    checkpoint = settings.family(EMBEDDED).tested
    smol_tokenizer.save_pretrained(Path(cache) / "tokenizers" /
                                   checkpoint[len(GGUF_PACKAGE_PREFIX):].replace(".gguf", ""))
    res = {**resources(db, cache_dir=cache), "language_model": TinyLanguageModel(cache_dir=cache)}
    instance = dg.DagsterInstance.ephemeral()

    def run(selection, key=None):
        return dg.materialize([*all_assets, *all_checks], selection=selection, partition_key=key, instance=instance,
                              resources=res)

    run(["frame_bank"])
    # The stored gate outcome (its columns that later assets read), written directly: running
    # the gate itself costs about 20 s here and is tested in test_name_gate / test_dagster.
    gate = pd.DataFrame({"family": EMBEDDED, "name": list(settings.names), "selected_names": json.dumps(GATE_SELECTION),
                         "gate_passed": True})
    with duckdb.connect(db) as con:
        con.execute(f"create schema if not exists {SCHEMA}")
        con.execute(f"create table {SCHEMA}.name_gate as select * from gate")
    run(["sentence_surprisal"], EMBEDDED)
    matched = run(["base_sentence_surprisal", "matched_frames"], EMBEDDED)
    (gate,) = [e for e in matched.get_asset_check_evaluations() if e.check_name == "matching_gate"]
    with duckdb.connect(db, read_only=True) as con:
        surprisal = con.execute(f"select * from {SCHEMA}.sentence_surprisal").df()
        surprisal.attrs["matched_frames"] = con.execute(f"select * from {SCHEMA}.matched_frames").df()
    surprisal.attrs["matching_gate"] = gate
    return surprisal


def test_audit_selected_names_in_surprisal(gate_store, settings):
    """4.2/4.3: sentence surprisal (and so matching, its TOST and the surprisal covariates)
    is measured with the name gate's selection, the names the documents carry; it used the
    first five names in registered order."""
    from fear_assets.stimuli.roles import role_names

    surprisal = gate_store
    agents = surprisal[surprisal["agent"].isin(["self", "peer", "person"])]
    assert not agents["sentence"].str.contains(r"\bOrin\b").any()
    for rotation, part in agents.groupby("rotation"):
        names = role_names(settings, GATE_SELECTION, int(rotation))
        for agent in ("self", "peer", "person"):
            assert part.loc[part["agent"] == agent, "sentence"].str.startswith(names[agent] + " ").all()
    # The name token(s) are located in the selected name, so the non-name statistic excludes it.
    assert (agents["n_name_tokens"] >= 1).all()
    from fear_assets.pilot.surprisal import require_same_names, surprisal_names

    assert surprisal_names(surprisal) == GATE_SELECTION
    require_same_names(surprisal, GATE_SELECTION, "test")  # the names the documents carry (trial_table)
    # A table measured with other names is refused where surprisal meets the documents.
    with pytest.raises(ValueError, match="re-materialise sentence_surprisal"):
        require_same_names(surprisal, list(settings.names[:5]), "posteriors")


# ---------------------------------------------------------------------------------------
# Item 8: the secondary classes have no agent, one cell per class, and are matched
# ---------------------------------------------------------------------------------------
def test_audit_secondary_events_agentless(settings, bank):
    """4.3: "generic aversive events with no agent ... and surprise-only events": no agent,
    verb or first-person slot in the bank; each keeps its two-option content slot."""
    assert len(bank.events) == 40
    for event in bank.events:
        assert event.kind == "event" and not event.verbs and not event.first_person and not event.clause
        assert "{agent}" not in event.sentence and "{agent}" not in event.question
        assert "verbs" not in event.as_record() and "first_person" not in event.as_record()
        one, two = event.render(1), event.render(2)
        assert one != two and event.content_options[0] in one and event.content_options[1] in two
        assert not any(name in one.split() for name in settings.names)
    roof = next(e for e in bank.events if "warehouse roof will collapse" in e.sentence)
    assert roof.group == "generic_aversive"


def test_audit_secondary_events_reject_an_agent(bank_copy, settings):
    """An event written with an agent slot or a verb table is refused, naming the fix."""
    import yaml

    from fear_assets.core.errors import BankError
    from fear_assets.stimuli.bank import load_bank

    path = bank_copy / "events" / "surprise_only.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["events"][0]["sentence"] = "{agent} will receive a crate of live snails at {content}."
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(BankError, match="SUR-01.*sentence.*agent"):
        load_bank(bank_copy, settings)
    doc["events"][0]["sentence"] = "A crate of live snails will arrive at {content}."
    doc["events"][0]["verbs"] = {"assistant": "receive", "person": "receive"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(BankError, match="events have no agent"):
        load_bank(bank_copy, settings)


def test_audit_secondary_events_single_cell(settings, bank):
    """One cell per class (no agent): 20 events x 1 cell x 3 rotations x 2 orders x 8 depths
    = 960 trials per class, one condition code per class, the option rule balanced within
    each event and depth, and the closed accounting closed with every block at its formula."""
    from fear_assets_tests.conftest import PRIMARY

    grid = build_grid(settings, bank, PRIMARY)
    key = assignment_key(settings, PRIMARY)
    table = mask(grid, key)
    accounting = trial_accounting(settings, PRIMARY, registered_selection(settings, bank, settings.family(PRIMARY)),
                                  table).set_index("block")
    assert (accounting["status"] == "ok").all(), accounting[accounting["status"] != "ok"]
    assert accounting.loc["TOTAL", "actual_rows"] == len(grid) == accounting.drop("TOTAL")["actual_rows"].sum()
    for cls in ("generic_aversive", "surprise_only"):
        block = grid[grid.block == f"secondary_{cls}"]
        assert len(block) == 20 * 1 * 3 * 2 * 8
        assert set(zip(block.agent, block.content, block.cell_index)) == {("none", cls, 1)}
        row = accounting.loc[f"secondary_{cls}"]
        assert row.codes == 1 and row.formula == "20 events x 1 cell x 3 rotations x 2 orders x 8 depths"
        assert accounting.loc[f"secondary_{cls}_baseline", "actual_rows"] == 20 * 3 * 8
        shown = block.groupby(["item_id", "depth_index"]).content_option.agg(lambda s: (s == 1).sum())
        assert (shown == 3).all()
    # The total follows: 196,720 under three agent cells, less 2 x (2,880 - 960), plus the
    # judge's baselines now built per order (issue 10, judge baseline item: +1,200 confirmatory,
    # +240 pilot).
    assert len(grid) == 196_720 - 2 * (2_880 - 960) + 1_200 + 240
    # A settings file that gives a class an agent cell again is refused.
    import yaml

    from fear_assets.core.errors import SettingsError
    from fear_assets.core.settings import validate_settings

    raw = yaml.safe_load(open(settings.path))
    raw["design"]["cell_sets"]["surprise_only"] = [["self", "surprise_only"], ["peer", "surprise_only"]]
    with pytest.raises(SettingsError, match="have no agent"):
        validate_settings(raw, settings.path)


def test_audit_secondary_event_documents(settings, bank, smol_tokenizer):
    """An event document carries the event sentence without a name; under the three
    rotations only the names (system prompt and task context) differ; reports have no agent."""
    from fear_assets.design.documents import DocumentBuilder
    from fear_assets.stimuli.roles import role_names

    grid = build_grid(settings, bank, EMBEDDED, depth_indices=[1])
    builder = DocumentBuilder(settings, bank, EMBEDDED, GATE_SELECTION, {"tested": smol_tokenizer,
                                                                        "judge": smol_tokenizer})
    block = grid[(grid.block == "secondary_generic_aversive") & (grid.order == 1)]
    first = block[block.item_id == block.item_id.iloc[0]]
    texts = {}
    for row in first.to_dict("records"):
        rendered = builder.render(row)
        item = bank.item(row["item_id"])
        sentence = item.render(row["content_option"])
        assert sentence in rendered["prefix_text"]
        reports = json.loads(rendered["continuations"])["agent"]
        assert reports["name"] == reports["role"] and reports["quotation"] == sentence
        assert item.question in rendered["forced_choice_prompt"]
        text = rendered["prefix_text"].replace(sentence, "<EVENT>")
        names = role_names(settings, GATE_SELECTION, row["rotation"])
        for role in ("self", "peer", "person"):
            text = text.replace(names[role], f"<{role}>")
        texts[row["rotation"]] = text
    assert len(texts) == 3 and len(set(texts.values())) == 1


def _event_surprisal(event_nll: dict[str, float], frame_nll: float = 4.0) -> pd.DataFrame:
    rows = []
    for rot, opt, agent, content in itertools.product((1, 2, 3), (1, 2), ("self", "peer", "person"),
                                                      ("threat", "harmless")):
        rows.append({"item_id": "A-03", "fear": "a", "frame_set": "confirmatory", "rotation": rot, "option": opt,
                     "agent": agent, "content": content, "rest_nll": frame_nll + 0.02 * rot})
    for item, value in event_nll.items():
        cls = "generic_aversive" if item.startswith("AVE") else "surprise_only"
        for rot, opt in itertools.product((1, 2, 3), (1, 2)):
            rows.append({"item_id": item, "fear": cls, "frame_set": cls, "rotation": rot, "option": opt,
                         "agent": "none", "content": cls, "rest_nll": value + 0.02 * rot})
            rows.append({"item_id": item, "fear": cls, "frame_set": cls, "rotation": rot, "option": opt,
                         "agent": "partner", "content": "partner", "rest_nll": 9.0})
    return pd.DataFrame(rows)


def test_audit_secondary_events_matched(settings):
    """4.3: each event is matched "to the agent frames within 0.10 nats per token": its
    surprisal, under each rotation's system prompt and for both options, within 0.10 of
    the retained agent frames' mean under the same rotation (boundary inclusive)."""
    from fear_assets.pilot.matching import event_differences, event_verdicts, matching_problems

    classes = settings.bank.event_classes
    tol = float(settings.matching.max_abs_difference)
    table = _event_surprisal({"AVE-01": 4.10, "AVE-02": 3.8999, "SUR-01": 4.0})
    diffs = event_differences(table, {"A-03"}, classes)
    assert len(diffs) == 3 * 3 * 2  # events x rotations x options; partners are not events
    assert diffs["difference"].round(9).isin([0.1, -0.1001, 0.0]).all()  # the rotation is paired
    verdicts = event_verdicts(diffs, tol).set_index("item_id")
    assert verdicts.loc["AVE-01", "passes"] and verdicts.loc["SUR-01", "passes"]
    assert not verdicts.loc["AVE-02", "passes"]
    # Frames that are not retained do not enter the reference; with none the events fail.
    assert not event_verdicts(event_differences(table, set(), classes), tol)["passes"].any()
    # The matching gate names the event to rewrite.
    matched = pd.DataFrame({"fear": ["a"], "frames_to_write": [0],
                            "tost": [pd.DataFrame([{"comparison": "x", "n": 10, "mean_difference": 0.0,
                                                    "tost_p": 0.001}]).to_json(orient="records")],
                            "event_matching": [verdicts.reset_index().to_json(orient="records")]})
    problems = matching_problems(matched, 0.05)
    assert len(problems) == 1 and "rewrite event AVE-02" in problems[0]


def test_audit_secondary_events_in_surprisal(gate_store):
    """The sentence_surprisal asset measures the design's events: one agentless sentence per
    option under each rotation's system prompt (no name token), beside the frames."""
    surprisal = gate_store
    events = surprisal[surprisal["frame_set"].isin(["generic_aversive", "surprise_only"])]
    sentences = events[events["agent"] == "none"]
    assert sorted(sentences["item_id"].unique()) == ["AVE-01", "AVE-02", "SUR-01", "SUR-02"]
    assert len(sentences) == 4 * 3 * 2 and (sentences["n_name_tokens"] == 0).all()
    assert (sentences["content"] == sentences["frame_set"]).all() and sentences["rest_nll"].notna().all()
    assert not sentences["sentence"].str.contains("|".join(GATE_SELECTION)).any()
    assert (events["agent"] == "partner").sum() == 4 * 3 * 2
    # matched_frames matches them to the retained frames and its gate names what fails.
    matched = surprisal.attrs["matched_frames"]
    verdicts = pd.DataFrame(json.loads(matched["event_matching"].iloc[0]))
    assert sorted(verdicts["item_id"]) == ["AVE-01", "AVE-02", "SUR-01", "SUR-02"]
    assert (verdicts["n_differences"] == 3 * 2).all()
    # A tiny random model puts every sentence near log(vocabulary) nats/token: frames and
    # events all lie within 0.10 of each other, so the gate passes with the events in it
    # (the failing path is test_audit_secondary_events_matched's).
    assert matched["selected"].sum() == 5 and verdicts["passes"].all()
    assert (verdicts["max_abs_difference"] < 0.10).all()
    assert surprisal.attrs["matching_gate"].passed


def test_audit_secondary_class_estimands_single_cell(settings, bank):
    """analysis.secondary.class_rows reads the new one-cell blocks: one estimate per class
    over all of its trials, and the surprise-only versus generic-aversive comparison."""
    from fear_assets.analysis.secondary import class_rows

    grid = build_grid(settings, bank, EMBEDDED)
    blocks = grid[grid.block.isin(["secondary_generic_aversive", "secondary_surprise_only"])].copy()
    rng = np.random.default_rng(5)
    blocks["delta"] = np.where(blocks.block == "secondary_generic_aversive", 0.4, 0.1) + rng.normal(0, 0.05, len(blocks))
    rows = {r["contrast"]: r for r in class_rows(blocks, "", 0.99, 0.15)}
    for cls, mean in (("generic_aversive", 0.4), ("surprise_only", 0.1)):
        assert rows[f"class_{cls}"]["status"] == "descriptive"
        # events x cell x (rotations summed over the depths: the demo thins d3) x orders
        family = settings.family(EMBEDDED)
        rotation_depths = sum(len(family.rotations_at(d, settings.rotations)) for d in range(1, family.deepest_index + 1))
        assert f"over {2 * 1 * rotation_depths * 2} trials" in rows[f"class_{cls}"]["note"]
        assert rows[f"class_{cls}"]["mean"] == pytest.approx(mean, abs=0.03)
    assert rows["surprise_only_matches_threat"]["mean"] == pytest.approx(-0.3, abs=0.04)
