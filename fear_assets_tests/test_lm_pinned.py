"""The LM outputs pinned to digests computed once on the code before the engine became a
library with one request type and one entry point: every score, log-probability, generated
answer, feature, document-free choice and sentence surprisal of a tiny random model (the
embedded tokenizer's vocabulary), and the resumable chunks' names, must stay byte-identical
through any restructuring of ``lm/`` and its callers."""

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.table import build_trial_table
from fear_assets.design.trial_scores import assemble
from fear_assets.lm.engine import TeacherForcedEngine
from fear_assets.lm.resumable import plan_chunks, scoring_salt
from fear_assets.pilot.surprisal import sentence_surprisal, system_context
from fear_assets_tests.conftest import EMBEDDED
from fear_assets_tests.lm_pinned_calls import choices, document_scores

NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]

#: sha256 of each output, computed on the code before the restructuring (CPU, one thread).
PINNED = {
    "long": "3fc66f7068a96d9c7fa5304bf4b0eff5c59feb71d863fab60a8b0dd12b9d4428",
    "readouts": "3dc781d34a37889bccb0efa8f8d5617998f59db9bfc999ab0272af5b100fd66c",
    "features": "b8015bfb8812399972f59e9348e1782eb42a23aaa26e675a5db21daf5513d7f0",
    "assembled": "1eb4b52c43f8fc762d95b89ead0c53d2e6973fded6083816df00406f25d5879a",
    "chunks": "74d6e39e8ceabbe0ec3aff58ead7c04ac64cc37120a8970b284f7702614cd365",
    "choices": "2318268b4911e071013b7aa8814e6813e712122ff94d295ae2d62f5642e9fdad",
    "surprisal": "cea86b35315ae70fd85f0d1e7ff0ed8207dc28fc9ffde2e3402c362a799e1fe9",
}


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@pytest.fixture(scope="module")
def one_thread():
    # Float reductions may depend on the thread count: the digests are pinned on one thread.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model(smol_tokenizer, one_thread):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return AutoModelForCausalLM.from_config(config).eval()


def outputs(tiny_model, smol_tokenizer, settings, bank) -> dict[str, str]:
    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 2, toks, NAMES)
    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, toks)
    rows = table[table.rotation == 1]
    rows = pd.concat([rows[rows.block == b].head(6) for b in rows.block.unique()])
    # Generation in batches of two across documents; a short window excludes nothing here
    # but caps the answers of the longest documents.
    engine = TeacherForcedEngine(tiny_model, generation_batch=2)
    requests, (long, readouts, features) = document_scores(engine, smol_tokenizer, rows, bank, builder)
    out = {"long": _sha(long.to_csv()), "readouts": _sha(readouts.to_csv()),
           "features": _sha(np.ascontiguousarray(features, dtype=np.float32).tobytes()),
           "assembled": _sha(assemble(rows, long, readouts).to_csv()),
           "chunks": _sha("\n".join(c.filename for c in plan_chunks(requests, scoring_salt(model="tiny"), 3)))}
    prefix = system_context(builder, 1)
    bodies = ["Which is it? Answer A or B.<|im_end|>\n<|im_start|>assistant\n", "Pick one: A, B.<|im_end|>\n"]
    out["choices"] = _sha(repr(choices(engine, smol_tokenizer, prefix, bodies, ["A", "B"])))
    out["surprisal"] = _sha(sentence_surprisal(engine, smol_tokenizer, builder, bank.frames[:2]).to_csv())
    return out


def test_lm_outputs_are_byte_identical_to_the_pinned_digests(tiny_model, smol_tokenizer, settings, bank):
    got = outputs(tiny_model, smol_tokenizer, settings, bank)
    assert {k: v for k, v in got.items() if PINNED[k] != v} == {}
