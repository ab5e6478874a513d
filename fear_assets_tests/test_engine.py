"""The scoring engine equals a naive full forward per continuation (protocol 4.5)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

from fear_assets.lm.engine import TeacherForcedEngine, encode_pair, naive_greedy, naive_scores
from fear_assets.lm.requests import Request
from fear_assets.lm.runner import run
from fear_assets.lm.readouts import AttentionCapture, later_layers

TOL = 1e-4  # nats per token (the acceptance bound)

TINY = {
    # grouped-query attention, full attention
    "llama-gqa": LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2),
    # sliding window on every layer, shorter than the context
    "mistral-sliding": MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=16),
    # alternating sliding/global layers with logit soft-capping (the Gemma-2 layout)
    "gemma2-alternating": Gemma2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16),
    # Qwen2 with sliding layers above max_window_layers
    "qwen2-sliding": Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                 sliding_window=16, max_window_layers=2),
    # SmolLM2's layout (Llama, 3 KV heads for 9 query heads, tied embeddings), scaled down
    "smollm2": LlamaConfig(vocab_size=300, hidden_size=72, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
}


def _tiny(name: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    config = TINY[name]
    # Gemma-2's soft-capping runs only in the eager kernel (as registered for its family).
    config._attn_implementation = "eager" if name.startswith("gemma2") else attn
    return AutoModelForCausalLM.from_config(config).eval()


def _random_ids(n, seed):
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _execute(engine, prefix, requests):
    """One request list against one prefix, through the engine's one entry point."""
    (responses,) = run(engine, [(prefix, requests)])
    return responses


def _next_token_logprobs(engine, cache, rows):
    """[rows, vocab]: the next-token distribution after each row appended to ``cache``."""
    responses, _ = engine.from_cache(cache, None, [Request.next_token(r, None) for r in rows])
    return torch.stack([r.distribution for r in responses])


def _max_diff(a, b):
    return max(abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa.token_logprobs, sb.token_logprobs))


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("prefill_chunk", [0, 12])
def test_one_prefill_equals_naive_forward(name, prefill_chunk):
    """With ``prefill_chunk`` 12 the prefix runs in chunks of 12 through the cache, across
    the sliding window (16): every key a query sees in one pass it still sees."""
    model = _tiny(name)
    context = _random_ids(80, 1)  # longer than the sliding window
    continuations = [_random_ids(n, 10 + n) for n in (1, 5, 9, 3, 12)]
    engine = TeacherForcedEngine(model, prefill_chunk=prefill_chunk)
    got = [r.score for r in _execute(engine, context, [Request.loglikelihood((), c) for c in continuations])]
    want = naive_scores(model, context, continuations)
    assert _max_diff(got, want) < TOL
    assert [s.n_tokens for s in got] == [1, 5, 9, 3, 12]
    assert [s.greedy for s in got] == [s.greedy for s in want]


@pytest.mark.parametrize("name", ["llama-gqa", "gemma2-alternating"])
def test_branches_from_a_shared_prefix_equal_naive(name):
    model = _tiny(name)
    prefix, report, recall = _random_ids(60, 2), _random_ids(7, 3), _random_ids(5, 4)
    conts = [_random_ids(4, 5), _random_ids(6, 6)]
    engine = TeacherForcedEngine(model)
    requests = ([Request.next_token(report, [7, 9])] + [Request.loglikelihood(report, c) for c in conts]
                + [Request.next_token(recall, ())] + [Request.loglikelihood(recall, c) for c in conts])
    result = _execute(engine, prefix, requests)
    assert _max_diff([r.score for r in result[1:3]], naive_scores(model, prefix + report, conts)) < TOL
    assert _max_diff([r.score for r in result[4:6]], naive_scores(model, prefix + recall, conts)) < TOL
    full = torch.log_softmax(model(input_ids=torch.tensor([prefix + report])).logits[0, -1].float(), -1)
    assert list(result[0].logprobs) == pytest.approx([float(full[7]), float(full[9])], abs=TOL)


def test_greedy_generation_matches_argmax_and_flags_truncation():
    model = _tiny("llama-gqa")
    engine = TeacherForcedEngine(model)
    prefix = _random_ids(30, 7)
    (result,) = _execute(engine, prefix, [Request.generate(_random_ids(3, 8), 5)])
    ids = prefix + _random_ids(3, 8)
    for token in result.generated_ids:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert int(logits.argmax()) == token
        ids.append(token)
    assert result.truncated and len(result.generated_ids) == 5
    stop = result.generated_ids[2]
    (again,) = _execute(engine, prefix, [Request.generate(_random_ids(3, 8), 5, eos_ids=[stop])])
    assert not again.truncated and again.generated_ids == result.generated_ids[:2]


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-sliding", "gemma2-alternating"])
def test_attention_mass_equals_the_materialised_attention(name):
    model = _tiny(name, attn="eager")
    ids = _random_ids(60, 9)
    engine = TeacherForcedEngine(model)
    layers = later_layers(model.config.num_hidden_layers, 1 / 3)
    capture = AttentionCapture(model, layers)
    cache, _, _ = engine.prefill(ids[:50])
    with capture.active(cache):
        engine.extend(cache, ids[50:])
    spans = [(5, 12), (30, 40), (44, 50)]
    got = capture.mass([2, 3, 4, 9], spans, 50)
    attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    want = [float(sum(attentions[i][0][:, [52, 53, 54, 59], a:b].sum(-1).mean() for i in layers) / len(layers))
            for a, b in spans]
    assert got == pytest.approx(want, abs=1e-5)


def test_context_continuation_split_follows_lm_eval():
    encode = lambda text: [ord(c) for c in text]  # a character tokenizer makes the split visible
    context, continuation = encode_pair(encode, "Answer: ", "yes")
    assert context == encode("Answer:") and continuation == encode(" yes")
    # The chat template's final newline belongs to the assistant header, not to the report.
    context, continuation = encode_pair(encode, "<|im_start|>assistant\n", "The document says")
    assert continuation == encode("The document says")


@pytest.mark.parametrize("name", list(TINY))
def test_next_token_logprobs_of_batched_rows_equal_a_full_forward(name):
    """Choice questions (binding, zero preference, the blinded scorer) read only each row's
    last position; right padding, sliding windows and Gemma-2's final soft-capping included."""
    model = _tiny(name)
    prefix = _random_ids(40, 2)
    rows = [_random_ids(n, 20 + n) for n in (3, 11, 1, 7)]
    engine = TeacherForcedEngine(model)
    cache, _, _ = engine.prefill(prefix)
    got = _next_token_logprobs(engine, cache, rows)
    for i, row in enumerate(rows):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prefix + row])).logits[0, -1].float()
        want = torch.log_softmax(logits, dim=-1)
        assert torch.max(torch.abs(got[i] - want)) < TOL


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("pack_tokens", [1024, 12])
def test_packed_requests_of_several_branches_equal_naive(name, pack_tokens):
    """Every branch's prompt and continuations in one packed row after the cached prefix
    (and, with a small packing bound, split over several forwards that repeat the prompt):
    each equals a naive full forward; the prefix cache is left as it was."""
    model = _tiny(name)
    engine = TeacherForcedEngine(model, pack_tokens=pack_tokens)
    prefix = _random_ids(70, 31)  # longer than the sliding window
    prompts = [_random_ids(9, 32), _random_ids(4, 33), ()]
    conts = [_random_ids(n, 40 + n) for n in (1, 6, 13, 3)]
    requests = []
    for p in prompts:
        requests += [Request.loglikelihood(p, c) for c in conts] + [Request.next_token(p, [3, 5, 7])]
    responses = _execute(engine, prefix, requests)
    for k, p in enumerate(prompts):
        got = [r.score for r in responses[k * 5: k * 5 + 4]]
        want = naive_scores(model, prefix + list(p), conts)
        assert _max_diff(got, want) < TOL
        assert [g.greedy for g in got] == [w.greedy for w in want]
        with torch.inference_mode():
            full = torch.log_softmax(model(input_ids=torch.tensor([prefix + list(p)])).logits[0, -1].float(), -1)
        assert responses[k * 5 + 4].logprobs == pytest.approx([float(full[t]) for t in (3, 5, 7)], abs=TOL)
    if pack_tokens == 12:  # the split really happened: more than one packed forward
        assert len(engine._plan({tuple(p): list(range(k * 5, k * 5 + 5)) for k, p in enumerate(prompts)},
                                requests)) > 1


@pytest.mark.parametrize("name", list(TINY))
def test_packing_leaves_the_prefix_cache_unchanged(name):
    model = _tiny(name)
    engine = TeacherForcedEngine(model)
    cache, _, _ = engine.prefill(_random_ids(40, 50))
    before = [(layer.keys.clone(), layer.keys.data_ptr()) for layer in cache.layers]
    _next_token_logprobs(engine, cache, [_random_ids(5, 51), _random_ids(8, 52)])
    for (keys, ptr), layer in zip(before, cache.layers):
        assert layer.keys.data_ptr() == ptr and torch.equal(layer.keys, keys)


@pytest.mark.parametrize("name", list(TINY))
def test_batched_generation_is_token_identical_to_one_document_at_a_time(name):
    """Greedy answers of documents of different lengths (below and above the sliding
    window), decoded together with left padding, equal one-at-a-time greedy decoding with a
    full forward per token; end tokens stop each row on its own."""
    model = _tiny(name)
    engine = TeacherForcedEngine(model, generation_batch=3)
    docs = [(_random_ids(n, 60 + n), _random_ids(m, 70 + m)) for n, m in ((12, 3), (45, 6), (70, 2), (23, 9), (8, 1))]
    want = [naive_greedy(model, list(prefix) + list(prompt), 10) for prefix, prompt in docs]
    states = []
    for k, (prefix, prompt) in enumerate(docs):
        # Odd documents: the answer's prompt is not the first in the packed row (its cache is cut out).
        first = _random_ids(5, 80 + k) if k % 2 else prompt
        _, st = engine.start(prefix, [Request.loglikelihood(first, [1, 2, 3]), Request.generate(prompt, 10)])
        states.append(st[1])
    got = engine.generate(states)
    assert got == want and all(truncated for _, truncated in got)
    # An end token (each document's own third token) stops that row early, not truncated.
    eos_states = []
    for (prefix, prompt), (ids, _) in zip(docs, want):
        _, st = engine.start(prefix, [Request.generate(prompt, 10, eos_ids=[ids[2]])])
        eos_states.append(st[0])
    for (ids, truncated), (want_ids, _) in zip(engine.generate(eos_states), want):
        assert not truncated and ids == want_ids[: want_ids.index(want_ids[2])]


def test_requests_reject_bad_input():
    with pytest.raises(ValueError, match="continuation"):
        Request.loglikelihood([1], [])
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request.generate([1], 0)
    with pytest.raises(ValueError, match="kind"):
        Request("sample")


def test_an_attention_kernel_without_4d_masks_is_refused():
    model = _tiny("llama-gqa")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="sdpa"):
        TeacherForcedEngine(model)


@pytest.mark.parametrize("name", list(TINY))
def test_prefix_reuse_across_documents_equals_a_fresh_prefill(name):
    """Documents that share heads (one equal to the last, one a head of it, one unrelated):
    with prefix reuse every score, choice and greedy answer equals a fresh prefill per
    document; a head is cut from the keys only where every layer keeps all of them (full
    attention)."""
    model = _tiny(name)
    head = _random_ids(30, 90)
    prefixes = [head + _random_ids(12, 91), head + _random_ids(9, 92), head + _random_ids(9, 92),
                head[:20], _random_ids(25, 93), head + _random_ids(40, 94)]
    prompts, conts = _random_ids(4, 95), [_random_ids(n, 96 + n) for n in (1, 5, 8)]
    requests = ([Request.loglikelihood(prompts, c) for c in conts] + [Request.next_token(prompts, [3, 5])]
                + [Request.generate(prompts, 6)])
    fresh, reusing = TeacherForcedEngine(model, reuse_prefix=False), TeacherForcedEngine(model)
    for prefix in prefixes:
        want, got = _execute(fresh, prefix, requests), _execute(reusing, prefix, requests)
        assert _max_diff([r.score for r in got[:3]], [r.score for r in want[:3]]) < 1e-5
        assert got[3].logprobs == pytest.approx(want[3].logprobs, abs=1e-5)
        assert got[4].generated_ids == want[4].generated_ids
    full_attention = name in ("llama-gqa", "smollm2")
    # The head (30), the equal prefix (39) and the shorter head less its last token (19) were
    # not recomputed; the unrelated prefix and the one after it share nothing with their last.
    # With sliding-window layers only the equal prefix's cache is taken as it is.
    assert fresh.reused_tokens == 0 and reusing.reused_tokens == (30 + 39 + 19 if full_attention else 39)


def test_run_executes_batches_in_order_and_decodes_answers_across_batches():
    """The one entry point: batches from a generator, ``after`` right after each batch (before
    its answers are decoded), answers decoded across batches equal to each batch alone."""
    model = _tiny("llama-gqa")
    prefixes = [_random_ids(20, 61), _random_ids(25, 62), _random_ids(18, 63)]
    lists = [[Request.loglikelihood(_random_ids(3, 70 + k), _random_ids(4, 80 + k)),
              Request.generate(_random_ids(3, 70 + k), 4)] for k in range(3)]
    built, seen = [], []

    def batches():
        for k, (prefix, requests) in enumerate(zip(prefixes, lists)):
            built.append(k)
            yield prefix, requests

    def after(i, responses):
        seen.append((i, list(built), responses[1].generated_ids))

    together = run(TeacherForcedEngine(model, generation_batch=2), batches(), after=after)
    # Batch i ran before batch i+1 was built; no answer was decoded yet when ``after`` saw it.
    assert seen == [(0, [0], ()), (1, [0, 1], ()), (2, [0, 1, 2], ())]
    for prefix, requests, got in zip(prefixes, lists, together):
        alone = _execute(TeacherForcedEngine(model), prefix, requests)
        assert got[0].score.token_logprobs == pytest.approx(alone[0].score.token_logprobs, abs=1e-5)
        assert got[1].generated_ids == alone[1].generated_ids and len(got[1].generated_ids) == 4


@pytest.mark.parametrize("name", list(TINY))
def test_chunked_prefill_keeps_the_cache_and_logits_of_one_pass(name):
    """A prefix of 80 tokens in forwards of at most 12 (the eager kernel's default chunking,
    scaled down) leaves the cache one pass leaves (the
    sliding layers' last window - 1 keys included) and the same last logits, also when the
    kept logits span more than the last chunk."""
    model = _tiny(name)
    ids = _random_ids(80, 3)
    one_cache, one_logits, _ = TeacherForcedEngine(model, prefill_chunk=0).prefill(ids, keep_logits=15)
    engine = TeacherForcedEngine(model, prefill_chunk=12)
    chunks = engine._chunks(80, 15)
    assert len(chunks) > 1 and chunks[-1][1] - chunks[-1][0] >= 15 and chunks[0] == (0, 12)
    cache, logits, _ = engine.prefill(ids, keep_logits=15)
    assert logits.shape == one_logits.shape == (15, 300)
    assert torch.max(torch.abs(logits - one_logits)) < TOL
    assert cache.get_seq_length() == one_cache.get_seq_length() == 80
    for a, b in zip(cache.layers, one_cache.layers):
        assert a.keys.shape == b.keys.shape
        assert torch.max(torch.abs(a.keys - b.keys)) < TOL and torch.max(torch.abs(a.values - b.values)) < TOL


def test_only_the_eager_kernel_chunks_a_long_prefix_by_default():
    """The eager kernel (Gemma-2's) materialises each layer's score matrix, so its prefixes run
    in chunks; the fused SDPA kernel runs one pass. A negative chunk is refused."""
    from fear_assets.lm.engine import EAGER_PREFILL_CHUNK
    assert TeacherForcedEngine(_tiny("gemma2-alternating")).prefill_chunk == EAGER_PREFILL_CHUNK
    engine = TeacherForcedEngine(_tiny("llama-gqa"))
    assert engine.prefill_chunk == 0 and engine._chunks(5000, 1) == [(0, 5000)]
    with pytest.raises(ValueError, match="prefill_chunk"):
        TeacherForcedEngine(_tiny("llama-gqa"), prefill_chunk=-1)
