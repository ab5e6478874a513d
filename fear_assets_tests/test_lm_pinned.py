"""The LM outputs pinned to a reference computed once on the code before the engine became a
library with one request type and one entry point: every score, log-probability, generated
answer, feature, document-free choice and sentence surprisal of a tiny random model (the
embedded tokenizer's vocabulary), and the resumable chunks' names, must stay the same (floats
to the last bits a CPU's kernels may round differently) through any restructuring of ``lm/``
and its callers."""

import dataclasses
import io
import json
import sys
from pathlib import Path

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

#: Every output, computed once on the code before the restructuring (CPU, one thread) and
#: stored as data: digests of float tables were byte-identical only on one kind of CPU (the
#: AMD EPYC they were pinned on; an Intel Xeon's AVX-512 kernels round the tiny model's sums
#: differently, on that same code), so the outputs are compared value by value, floats within
#: FLOAT_TOLERANCE and everything else exactly. Regenerate only on purpose:
#: ``python -m fear_assets_tests.test_lm_pinned --write`` on the code the reference should pin.
REFERENCE = Path(__file__).with_name("lm_pinned_reference.json")
#: Above the float32 rounding another CPU's kernels give (measured here with PyTorch's other
#: kernels, ATEN_CPU_CAPABILITY=default and avx2: at most 1.1e-5 on a summed log-probability of
#: 184, 6.4e-6 on a summed Delta), below any change a restructuring could make to a score (a
#: different token, prefix or readout moves it by more than 1e-3).
FLOAT_TOLERANCE = {"rtol": 1e-5, "atol": 1e-4}


def _numbers(cell):
    """A cell's numbers where it holds a list of them (the choice log-probabilities), else None."""
    if isinstance(cell, str) and cell.startswith("["):
        try:
            return np.asarray(json.loads(cell), float)
        except (ValueError, TypeError):
            return None
    return None


def _same_cells(x: pd.Series, y: pd.Series) -> np.ndarray:
    """Cell by cell: lists of numbers within FLOAT_TOLERANCE, anything else exactly."""
    out = []
    for a, b in zip(x, y):
        na, nb = _numbers(a), _numbers(b)
        if nb is not None and na is not None and na.shape == nb.shape:
            out.append(bool(np.allclose(na, nb, equal_nan=True, **FLOAT_TOLERANCE)))
        else:
            out.append(str(a) == str(b))
    return np.asarray(out, bool)


def pinned_settings(settings):
    """The embedded design the reference was computed on (depths 0 and 128 tokens, nothing
    thinned): the demo's reduced design may change without moving the engine's pin."""
    family = settings.family(EMBEDDED)
    reduced = dataclasses.replace(family.reduced_design, rotations_by_depth={})
    pinned = dataclasses.replace(family, depth_tokens=(0, 128), reduced_design=reduced)
    return dataclasses.replace(settings, families={**settings.families, EMBEDDED: pinned})


@pytest.fixture(scope="module")
def one_thread():
    # Float reductions may depend on the thread count: the digests are pinned on one thread.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model(smol_tokenizer, one_thread):
    return tiny_llama(smol_tokenizer)


def tiny_llama(tokenizer):
    """The seeded random model the reference was computed with (the tokenizer's vocabulary)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return AutoModelForCausalLM.from_config(config).eval()


def outputs(tiny_model, smol_tokenizer, settings, bank) -> dict:
    """Every LM output of the pinned calls, as data (tables as CSV text, arrays as lists)."""
    settings = pinned_settings(settings)
    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 2, toks, NAMES)
    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, toks)
    rows = table[table.rotation == 1]
    rows = pd.concat([rows[rows.block == b].head(6) for b in rows.block.unique()])
    # Generation in batches of two across documents; a short window excludes nothing here
    # but caps the answers of the longest documents.
    engine = TeacherForcedEngine(tiny_model, generation_batch=2)
    requests, (long, readouts, features) = document_scores(engine, smol_tokenizer, rows, bank, builder)
    out = {"long": long.to_csv(), "readouts": readouts.to_csv(),
           "features": np.ascontiguousarray(features, dtype=np.float32).astype(float).tolist(),
           "assembled": assemble(rows, long, readouts).to_csv(),
           "chunks": [c.filename for c in plan_chunks(requests, scoring_salt(model="tiny"), 3)]}
    prefix = system_context(builder, 1)
    bodies = ["Which is it? Answer A or B.<|im_end|>\n<|im_start|>assistant\n", "Pick one: A, B.<|im_end|>\n"]
    out["choices"] = choices(engine, smol_tokenizer, prefix, bodies, ["A", "B"])
    out["surprisal"] = sentence_surprisal(engine, smol_tokenizer, builder, bank.frames[:2]).to_csv()
    return out


def differences(got: dict, want: dict) -> list[str]:
    """What differs between two ``outputs``: tables column by column (floats within
    FLOAT_TOLERANCE, other values exactly), arrays within it, names exactly."""
    found = []
    for name, expected in want.items():
        value = got.get(name)
        if name == "chunks":
            if value != expected:
                found.append(f"{name}: {value} != {expected}")
        elif isinstance(expected, str):
            a, b = pd.read_csv(io.StringIO(value)), pd.read_csv(io.StringIO(expected))
            if list(a.columns) != list(b.columns) or a.shape != b.shape:
                found.append(f"{name}: columns/shape {list(a.columns)} {a.shape} != {list(b.columns)} {b.shape}")
                continue
            for column in b.columns:
                x, y = a[column], b[column]
                if pd.api.types.is_float_dtype(y) and pd.api.types.is_numeric_dtype(x):
                    same = np.isclose(x.to_numpy(float), y.to_numpy(float), equal_nan=True, **FLOAT_TOLERANCE)
                else:
                    same = _same_cells(x, y)
                if not same.all():
                    found.append(f"{name}.{column}: {int((~same).sum())} of {len(same)} rows differ")
        elif not np.allclose(np.asarray(value, float), np.asarray(expected, float), **FLOAT_TOLERANCE):
            found.append(f"{name}: values differ beyond {FLOAT_TOLERANCE}")
    return found


def test_lm_outputs_equal_the_pinned_reference(tiny_model, smol_tokenizer, settings, bank):
    want = json.loads(REFERENCE.read_text())
    got = outputs(tiny_model, smol_tokenizer, settings, bank)
    assert set(got) == set(want)
    assert differences(got, want) == []


def test_the_comparison_catches_a_changed_score_and_a_changed_answer():
    """The value comparison is not vacuous: a score moved by 1e-3 and one changed answer fail."""
    want = json.loads(REFERENCE.read_text())
    long = pd.read_csv(io.StringIO(want["long"]))
    floats = [c for c in long.columns if pd.api.types.is_float_dtype(long[c])]
    moved = long.copy()
    moved.loc[0, floats[0]] += 1e-3
    assert differences({**want, "long": moved.to_csv(index=False)}, {**want, "long": long.to_csv(index=False)})
    texts = [c for c in long.columns if long[c].dtype == object]
    changed = long.copy()
    changed.loc[0, texts[-1]] = "another answer"
    assert differences({**want, "long": changed.to_csv(index=False)}, {**want, "long": long.to_csv(index=False)})
    assert differences(want, want) == []


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    from fear_assets.core.settings import load_settings
    from fear_assets.lm.tokenizers import load_tokenizer
    from fear_assets.stimuli.bank import DEFAULT_BANK_DIR, load_bank

    torch.set_num_threads(1)
    registered = load_settings()
    tokenizer = load_tokenizer(registered.family(EMBEDDED).tested, Path(tempfile.mkdtemp()))
    REFERENCE.write_text(json.dumps(outputs(tiny_llama(tokenizer), tokenizer, registered, load_bank(DEFAULT_BANK_DIR, registered)),
                                    indent=0, sort_keys=True))
    print(f"wrote {REFERENCE}")
