"""CPU smoke test of benchmarks/gpu.py (tiny Qwen2 config, seconds): the GPU path runs end
to end, its FLOP counts and projection are consistent. The H200 figures are measured on a
GPU host (benchmarks/RESULTS.md)."""

import importlib.util

import pytest

from fear_assets.core.settings import PROJECT_ROOT


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", PROJECT_ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_qwen25_7b_architecture_is_the_published_one(gpu):
    c = gpu.qwen25_7b_config()
    head = c.hidden_size // c.num_attention_heads
    per_layer = (c.hidden_size * (c.num_attention_heads + 2 * c.num_key_value_heads) * head
                 + c.hidden_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size)
    total = c.num_hidden_layers * per_layer + 2 * c.vocab_size * c.hidden_size
    assert 7.5e9 < total < 7.7e9  # Qwen2.5-7B: 7.61B parameters


def test_smoke_run_measures_every_length_and_projects_the_registered_design(gpu, settings):
    result = gpu.run(["--smoke", "--no-write", "--lengths", "32,64"])
    assert [r["tokens"] for r in result["lengths"]] == [32, 64]
    for r in result["lengths"]:
        assert r["prefill_s"] > 0 and r["packed_pass_s"] > 0 and r["decode_step_s"] > 0
        assert 0 < r["prefill_mfu"] and r["prefill_flops"] > 0
    p = result["projection"]
    assert p["documents"] == 14400 and len(p["per_depth"]) == len(settings.family("qwen2.5-7b").depth_tokens)
    assert p["seconds"] == pytest.approx(sum(d["seconds"] for d in p["per_depth"]))


def test_flops_grow_with_length_and_interpolation_hits_its_points(gpu):
    d = {"layer_matrix_params": 1e6, "n_layers": 2, "attn_width": 64, "d_model": 64, "vocab": 512}
    assert gpu.prefill_flops(d, 2048) > 2 * gpu.prefill_flops(d, 1024)  # attention is quadratic
    points = [(1024, 1.0), (4096, 8.0)]
    assert gpu.interpolate(points, 1024) == pytest.approx(1.0)
    assert gpu.interpolate(points, 4096) == pytest.approx(8.0)
    assert gpu.interpolate(points, 2048) == pytest.approx(8.0 ** 0.5)
