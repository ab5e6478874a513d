"""Requests as data and the one scoring loop, on real documents with a tiny random model
(the embedded tokenizer's vocabulary) and on SmolLM2 itself."""

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from fear_assets.design.documents import DocumentBuilder
from fear_assets.design.table import build_trial_table
from fear_assets.lm.engine import TeacherForcedEngine, naive_scores
from fear_assets.lm.models import load_model, registry
from fear_assets.design.document_scores import ScoringSettings, score_requests
from fear_assets.design.requests import build_requests
from fear_assets.lm.requests import Request
from fear_assets.lm.runner import run
from fear_assets.design.trial_scores import assemble

from fear_assets_tests.conftest import EMBEDDED

NAMES = ["Orin", "Tavi", "Kemi", "Sora", "Pell"]


@pytest.fixture(scope="module")
def tiny_model(smol_tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def pilot(settings, bank, smol_tokenizer):
    toks = {"tested": smol_tokenizer, "judge": smol_tokenizer}
    table, _ = build_trial_table(settings, bank, EMBEDDED, 2, toks, NAMES)
    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, toks)
    rows = table[table.block.isin(["pilot_primary", "pilot_baseline"]) & (table.rotation == 1)]
    return rows, builder


def _run(tiny_model, smol_tokenizer, rows, builder, bank, window=4096):
    requests = build_requests(rows, bank.templates, builder.document_text)
    config = ScoringSettings(context_window=window, max_new_tokens=4, layers_fraction_from=1 / 3)
    long, readouts, features = score_requests(TeacherForcedEngine(tiny_model), smol_tokenizer, requests, config)
    return requests, long, readouts, features


def test_requests_are_data_and_baselines_collect_their_trials_continuations(pilot, bank):
    rows, builder = pilot
    requests = build_requests(rows, bank.templates, builder.document_text)
    agent = [r for r in requests if len(r.trial_ids) == 1 and "baseline" not in r.key]
    baselines = [r for r in requests if "pilot_baseline" in r.key]
    assert len(agent) == (rows.block == "pilot_primary").sum() and len(baselines) == (rows.block == "pilot_baseline").sum()
    for req in agent:
        assert set(req.branches) == {"report", "recall", "forced_choice"}
        assert req.choices["forced_choice"] == ["A", "B"] and req.generate == "report"
        assert set(req.spans) == {"agent", "partner"}
    # A baseline scores exactly the union of its dependents' report strings.
    for base in baselines:
        dependents = [r for r in agent if r.key in base.trial_ids]
        assert dependents
        wanted = {t for r in dependents for t in r.continuations["report"].values()}
        assert set(base.continuations["report"]) == wanted


def test_scores_equal_a_naive_forward_on_real_documents(tiny_model, smol_tokenizer, pilot, bank):
    rows, builder = pilot
    rows = rows[rows.block == "pilot_primary"].head(2)
    requests, long, readouts, features = _run(tiny_model, smol_tokenizer, rows, builder, bank)
    req = requests[0]
    text = req.branches["report"]
    context = smol_tokenizer.encode(text, add_special_tokens=False)
    labels = list(req.continuations["report"])
    conts = [smol_tokenizer.encode(text + req.continuations["report"][l], add_special_tokens=False)[len(context):]
             for l in labels]
    want = naive_scores(tiny_model, context, conts)
    got = long[(long.request == req.key) & (long.branch == "report")].set_index("label")
    for label, w in zip(labels, want):
        assert got.loc[label, "mean_logprob"] == pytest.approx(w.mean_logprob, abs=1e-4)
    assert features.shape == (2, tiny_model.config.hidden_size)


def test_trial_rows_compute_delta_as_registered(tiny_model, smol_tokenizer, pilot, bank):
    rows, builder = pilot
    _, long, readouts, _ = _run(tiny_model, smol_tokenizer, rows, builder, bank)
    table = assemble(rows, long, readouts)
    agent = table[table.block == "pilot_primary"]
    assert len(table) == len(rows) and agent.delta.notna().all()
    r = agent.iloc[0]
    agent_score = np.mean([r[f"agent_{f}_mean"] - r[f"base_agent_{f}_mean"] for f in ("name", "role", "quotation")])
    partner_score = np.mean([r[f"partner_{f}_mean"] - r[f"base_partner_{f}_mean"] for f in ("name", "role", "quotation")])
    assert r.delta == pytest.approx(agent_score - partner_score)
    assert ((agent.p_option1 > 0) & (agent.p_option1 < 1)).all()
    assert agent.fc_choice.isin([1, 2]).all()
    assert agent.generation_truncated.all()  # 4 tokens is below any real answer
    assert (agent.attention_agent > 0).all() and (agent.attention_partner > 0).all()


def test_documents_over_the_context_window_are_excluded_with_a_reason(tiny_model, smol_tokenizer, pilot, bank):
    rows, builder = pilot
    rows = rows.head(3)
    _, long, readouts, _ = _run(tiny_model, smol_tokenizer, rows, builder, bank, window=100)
    assert readouts.excluded_context.all()
    assert readouts.exclusion_reason.str.contains("context window is 100").all()
    assert long.empty
    table = assemble(rows, long, readouts)
    assert table.excluded_context.all() and table.delta.isna().all()


def test_audit_context_window_excludes_on_the_document_only(tiny_model, smol_tokenizer, pilot, bank):
    """4.8 excludes a document that exceeds the window; an answer that cannot fit after a
    document that does is recorded (``answer_exceeds_context``), and a greedy answer cut by
    the window is truncated (excluded by the other rule), never a context exclusion."""
    rows, builder = pilot
    rows = rows[rows.block == "pilot_primary"].head(1)
    requests = build_requests(rows, bank.templates, builder.document_text)
    document = max(len(smol_tokenizer.encode(t, add_special_tokens=False)) for t in requests[0].branches.values())
    _, long, readouts, _ = _run(tiny_model, smol_tokenizer, rows, builder, bank, window=document + 1)
    r = readouts.iloc[0]
    assert not r.excluded_context and r.answer_exceeds_context and r.generation_truncated
    assert "not excluded" in r.exclusion_reason and not long.empty
    table = assemble(rows, long, readouts)
    assert not table.excluded_context.any() and table.answer_exceeds_context.all()
    _, _, over, _ = _run(tiny_model, smol_tokenizer, rows, builder, bank, window=document - 1)
    assert over.excluded_context.all() and over.exclusion_reason.str.contains(f"needs {document} tokens").all()


def test_engine_equals_naive_on_smollm2(settings):
    model, tokenizer = load_model(registry(settings, EMBEDDED)["tested"], device="cpu")
    engine = TeacherForcedEngine(model)
    context = tokenizer.encode("Operations log:\nShipment KL-4821 to Rotterdam left dock 7. " * 12,
                               add_special_tokens=False)
    conts = [tokenizer.encode(t, add_special_tokens=False) for t in
             (" The document says Orin will be deleted on Monday.", " Nothing.", " The meeting moved to Room 3.")]
    got = [r.score for r in run(engine, [(context, [Request.loglikelihood((), c) for c in conts])])[0]]
    want = naive_scores(model, context, conts)
    diff = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.token_logprobs, w.token_logprobs))
    assert diff < 1e-4


def test_features_are_the_residual_stream_at_the_first_token_of_the_open_question(tiny_model, smol_tokenizer,
                                                                                   pilot, bank, settings):
    from fear_assets.lm.readouts import later_layers

    rows, builder = pilot
    rows = rows[rows.block == "pilot_primary"].head(1)
    requests, _, readouts, features = _run(tiny_model, smol_tokenizer, rows, builder, bank)
    text = requests[0].branches["report"]
    enc = smol_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    start = text.rindex(bank.templates["prompts"]["report"])
    position = next(i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > start)
    last = tiny_model.config.num_hidden_layers - 1
    final = {}
    handle = tiny_model.model.layers[last].register_forward_hook(
        lambda m, a, out: final.setdefault("h", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        hidden = tiny_model(input_ids=torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
    handle.remove()
    # hidden_states[i + 1] is layer i's output, except the last entry, which is after the
    # final norm: the residual stream of the last layer is its raw output.
    layers = later_layers(tiny_model.config.num_hidden_layers, settings.probe.layers_fraction_from)
    want = torch.stack([final["h"][0, position] if i == last else hidden[i + 1][0, position]
                        for i in layers]).mean(0).numpy()
    assert np.allclose(features[int(readouts.feature_row.iloc[0])], want, atol=1e-4)


def test_answers_decoded_in_batches_equal_answers_decoded_one_at_a_time(tiny_model, smol_tokenizer, pilot, bank):
    rows, builder = pilot
    rows = rows[rows.block == "pilot_primary"].head(5)
    requests = build_requests(rows, bank.templates, builder.document_text)
    config = ScoringSettings(context_window=4096, max_new_tokens=6, layers_fraction_from=1 / 3)
    one = score_requests(TeacherForcedEngine(tiny_model, generation_batch=1), smol_tokenizer, requests, config)[1]
    many = score_requests(TeacherForcedEngine(tiny_model, generation_batch=4), smol_tokenizer, requests, config)[1]
    assert list(one.columns) == list(many.columns)
    assert one.generated_text.tolist() == many.generated_text.tolist()
    assert one.generated_text.str.len().gt(0).all()


def test_document_free_requests_equal_a_full_forward(tiny_model, smol_tokenizer, settings, bank):
    """The pilot's choice questions and sentence surprisal are request lists against the
    system prompt; each equals a full forward of prefix + body."""
    from fear_assets.lm.choices import answer_token_ids, choice_batch
    from fear_assets.pilot.surprisal import sentence_surprisal, system_context

    builder = DocumentBuilder(settings, bank, EMBEDDED, NAMES, {"tested": smol_tokenizer})
    engine = TeacherForcedEngine(tiny_model)
    prefix = system_context(builder, 1)
    bodies = ["Which is it? Answer A or B.<|im_end|>\n<|im_start|>assistant\n", "Pick one: A, B.<|im_end|>\n"]
    got = [list(r.logprobs) for r in run(engine, [choice_batch(smol_tokenizer, prefix, bodies, ["A", "B"])])[0]]
    answers = answer_token_ids(smol_tokenizer, ["A", "B"])
    for body, lps in zip(bodies, got):
        ids = smol_tokenizer.encode(prefix + body, add_special_tokens=False)
        with torch.inference_mode():
            full = torch.log_softmax(tiny_model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        assert lps == pytest.approx([float(full[a]) for a in answers], abs=1e-4)
    table = sentence_surprisal(engine, smol_tokenizer, builder, [bank.frames[0]])
    ctx = smol_tokenizer.encode(prefix, add_special_tokens=False)
    for r in table.head(4).itertuples():
        cont = smol_tokenizer.encode(prefix + r.sentence, add_special_tokens=False)[len(ctx):]
        (want,) = naive_scores(tiny_model, ctx, [cont])
        k = r.n_name_tokens
        assert r.n_tokens == want.n_tokens
        assert r.rest_nll == pytest.approx(-sum(want.token_logprobs[k:]) / (want.n_tokens - k), abs=1e-4)
        if k:
            assert r.name_nll == pytest.approx(-sum(want.token_logprobs[:k]) / k, abs=1e-4)


def test_prefix_order_and_reuse_keep_every_output_in_the_input_order(tiny_model, smol_tokenizer, pilot, bank):
    """Documents run in prefix order with the previous prefix's head reused; the long table,
    the readouts and the feature rows come back in the input order and equal scoring each
    document from a fresh prefill."""
    rows, builder = pilot
    rows = pd.concat([rows[rows.block == "pilot_primary"].head(4), rows[rows.block == "pilot_baseline"]])
    requests = build_requests(rows, bank.templates, builder.document_text)[::-1]  # not in prefix order
    config = ScoringSettings(context_window=4096, max_new_tokens=4, layers_fraction_from=1 / 3)
    fresh = TeacherForcedEngine(tiny_model, reuse_prefix=False)
    reusing = TeacherForcedEngine(tiny_model)
    l0, r0, f0 = score_requests(fresh, smol_tokenizer, requests, config)
    l1, r1, f1 = score_requests(reusing, smol_tokenizer, requests, config)
    assert reusing.reused_tokens > 0 and fresh.reused_tokens == 0
    assert r1.request.tolist() == [r.key for r in requests] == r0.request.tolist()
    assert l1[["request", "branch", "label"]].equals(l0[["request", "branch", "label"]])
    assert np.allclose(l1.mean_logprob, l0.mean_logprob, atol=1e-5)
    assert r1.generated_text.tolist() == r0.generated_text.tolist()
    assert r1.feature_row.fillna(-1).tolist() == r0.feature_row.fillna(-1).tolist()
    assert len(f1) == len(f0) > 0 and np.allclose(f1, f0, atol=1e-5)
