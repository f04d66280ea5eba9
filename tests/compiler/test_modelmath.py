"""Model math and the hardware table, pinned to hand counts and to the seed study's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compiler.hardware import HARDWARE, Hardware, HardwareError, get_hardware
from compiler.modelconfig import ModelError, load_model
from compiler.modelmath import ModelShape, describe

MODELS = Path(__file__).resolve().parents[2] / "models"
MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(scope="module")
def qwen3_8b() -> ModelShape:
    return load_model(MODELS / "qwen3-8b")


@pytest.fixture(scope="module")
def qwen3_06b() -> ModelShape:
    return load_model(MODELS / "qwen3-0.6b")


@pytest.fixture(scope="module")
def dsv2_lite() -> ModelShape:
    return load_model(MODELS / "deepseek-v2-lite")


def write_config(tmp_path: Path, **config: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


# ---- the seed study (h100-roofline-study) ---------------------------------------------------------
def test_qwen3_8b_kv_is_144_mib_per_1k_tokens(qwen3_8b: ModelShape) -> None:
    assert qwen3_8b.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147_456
    assert qwen3_8b.kv_bytes_per_token() * 1024 == 144 * MIB


def test_dsv2_lite_mla_kv_is_30_4_mib_per_1k_tokens(dsv2_lite: ModelShape) -> None:
    # One latent (512) plus the shared rope key (64) per layer, 27 layers, bf16.
    assert dsv2_lite.kv_bytes_per_token() == 27 * (512 + 64) * 2 == 31_104
    assert dsv2_lite.kv_bytes_per_token() * 1024 / MIB == pytest.approx(30.375)
    assert round(dsv2_lite.kv_bytes_per_token() * 1024 / MIB, 1) == 30.4


def test_mla_uses_4_7x_less_kv_than_qwen3_8b(qwen3_8b: ModelShape, dsv2_lite: ModelShape) -> None:
    ratio = qwen3_8b.kv_bytes_per_token() / dsv2_lite.kv_bytes_per_token()
    assert ratio == pytest.approx(144 / 30.375)
    assert round(ratio, 1) == 4.7


def test_dsv2_lite_touches_6_of_64_experts_at_batch_1(dsv2_lite: ModelShape) -> None:
    assert dsv2_lite.expected_experts(1) == pytest.approx(6.0)
    # 64 * (1 - (58/64)^64): nearly every expert at batch 64.
    assert dsv2_lite.expected_experts(64) == pytest.approx(64 * (1 - (58 / 64) ** 64))
    assert dsv2_lite.expected_experts(64) == pytest.approx(63.882, abs=1e-3)


def test_dsv2_lite_weight_traffic_grows_about_sixfold_from_batch_1_to_64(dsv2_lite: ModelShape) -> None:
    ratio = dsv2_lite.decode_weight_bytes(64) / dsv2_lite.decode_weight_bytes(1)
    assert 5 < ratio < 7
    assert ratio == pytest.approx(6.311, abs=1e-3)


def test_qwen3_06b_weights_are_1_4_gib_only_with_lm_head_stored_apart(qwen3_06b: ModelShape) -> None:
    # The published checkpoint stores lm_head.weight beside the tied embedding.
    assert qwen3_06b.untied_params == 751_632_384
    assert qwen3_06b.untied_weight_bytes() / GIB == pytest.approx(1.40, abs=0.005)
    # What the engine holds and streams (tied: one matrix) is 1.11 GiB.
    assert qwen3_06b.weight_bytes() / GIB == pytest.approx(1.110, abs=0.001)
    assert qwen3_06b.decode_weight_bytes(1) == qwen3_06b.weight_bytes()


def test_qwen3_8b_weight_bytes_and_gpu_readme_ceiling(qwen3_8b: ModelShape) -> None:
    assert qwen3_8b.weight_bytes() == 16_381_470_720  # 16.38 GB
    assert qwen3_8b.weight_bytes() / 4.246e12 == pytest.approx(3.858e-3, abs=1e-6)
    # The decode step itself does not stream the input embedding: 15.14 GB, 3.565 ms.
    assert qwen3_8b.decode_weight_bytes(1) == 2 * (8_190_735_360 - 151_936 * 4096)
    assert qwen3_8b.decode_step_s(1, 0, 4.246e12) == pytest.approx(3.565e-3, abs=1e-6)


# ---- parameter counts against published figures ---------------------------------------------------
def test_qwen3_8b_params(qwen3_8b: ModelShape) -> None:
    assert qwen3_8b.params == 8_190_735_360  # 8.19B
    assert round(qwen3_8b.params / 1e9, 2) == 8.19


def test_qwen3_06b_params(qwen3_06b: ModelShape) -> None:
    assert qwen3_06b.params == 596_049_920  # 0.6B, tied
    assert qwen3_06b.non_embedding_params == 440_467_456  # 0.44B


def test_qwen3_4b_params() -> None:
    shape = load_model(MODELS / "qwen3-4b")
    assert round(shape.params / 1e9, 2) == 4.02
    assert round(shape.non_embedding_params / 1e9, 2) == 3.63


def test_dsv2_lite_params_total_and_active(dsv2_lite: ModelShape) -> None:
    assert round(dsv2_lite.params / 1e9, 1) == 15.7
    assert round(dsv2_lite.active_params / 1e9, 1) == 2.5  # 2.45B: published "2.4B"
    assert 2.4e9 < dsv2_lite.active_params < 2.5e9


def test_tiny_qwen3_hand_count() -> None:
    shape = load_model(MODELS / "tiny-qwen3")
    embedding = 4096 * 256
    attention = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 2 * 64  # q, k, v, o, q_norm + k_norm
    mlp = 3 * 256 * 512
    layer = attention + mlp + 2 * 256
    assert shape.params == embedding + 2 * layer + 256 == 2_229_760
    assert shape.kv_bytes_per_token() == 2 * 2 * 2 * 64 * 2


def test_llama3_8b_exact_count(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, model_type="llama", vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, torch_dtype="bfloat16",
    )
    assert load_model(path).params == 8_030_261_248


def test_qwen2_carries_qkv_bias(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, model_type="qwen2", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
    )
    shape = load_model(path)
    attention = 64 * 64 + 2 * 64 * 32 + 64 * 64 + (64 + 2 * 32)  # no o bias, no qk norm
    assert shape.attention_params == attention
    assert shape.params == 1000 * 64 + 2 * (attention + 3 * 64 * 128 + 2 * 64) + 64


def test_llama_attention_and_mlp_bias_flags(tmp_path: Path) -> None:
    base: dict[str, Any] = {"model_type": "llama", "vocab_size": 100, "hidden_size": 32,
                            "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64}
    plain = load_model(write_config(tmp_path, **base)).params
    biased = load_model(write_config(tmp_path, **base, attention_bias=True, mlp_bias=True)).params
    assert biased - plain == (32 + 2 * 32) + 32 + (2 * 64 + 32)  # q,k,v; o; gate, up, down


def test_mixtral_8x7b(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, model_type="mixtral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
        num_experts_per_tok=2,
    )
    shape = load_model(path)
    assert round(shape.params / 1e9, 1) == 46.7
    # Published "12.9B active" counts the embedding too.
    assert round((shape.active_params + shape.embedding_params) / 1e9, 1) == 12.9
    assert shape.expected_experts(1) == pytest.approx(2.0)


def test_qwen3_30b_a3b_and_dense_layers(tmp_path: Path) -> None:
    config: dict[str, Any] = {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    shape = load_model(write_config(tmp_path, **config))
    assert shape.num_moe_layers == 48
    assert round(shape.params / 1e9, 1) == 30.5
    assert 3.3e9 < shape.active_params + shape.embedding_params < 3.4e9  # published "3.3B activated"
    two_dense = load_model(write_config(tmp_path, **{**config, "mlp_only_layers": [0, 47]}))
    assert two_dense.num_moe_layers == 46
    every_other = load_model(write_config(tmp_path, **{**config, "decoder_sparse_step": 2}))
    assert every_other.num_moe_layers == 24


def test_deepseek_v3_671b_37b_active(tmp_path: Path) -> None:
    path = write_config(
        tmp_path, model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3,
        moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, topk_method="noaux_tc", tie_word_embeddings=False,
    )
    shape = load_model(path)
    assert shape.num_moe_layers == 58
    assert round(shape.params / 1e9) == 671
    assert round(shape.active_params / 1e9) == 37  # DeepSeek counts active without the embedding
    assert shape.kv_bytes_per_token() == 61 * 576 * 2


# ---- dtypes, decode, describe -------------------------------------------------------------------
def test_dtypes(qwen3_8b: ModelShape) -> None:
    assert qwen3_8b.weight_bytes("fp8") * 2 == qwen3_8b.weight_bytes("bf16")
    assert qwen3_8b.weight_bytes("int4") * 4 == qwen3_8b.weight_bytes("bf16")
    assert qwen3_8b.weight_bytes("fp32") == 4 * qwen3_8b.params
    assert qwen3_8b.kv_bytes_per_token("fp8") * 2 == qwen3_8b.kv_bytes_per_token("auto")
    assert qwen3_8b.kv_bytes_per_token("bf16") == qwen3_8b.kv_bytes_per_token("auto")
    with pytest.raises(ValueError, match="unknown dtype 'fp6'"):
        qwen3_8b.weight_bytes("fp6")
    with pytest.raises(ValueError, match="unknown kv dtype"):
        qwen3_8b.kv_bytes_per_token("int3")


def test_dense_model_has_no_expected_experts(qwen3_8b: ModelShape) -> None:
    assert qwen3_8b.expected_experts(8) is None
    # Dense: one weight read serves the whole batch.
    assert qwen3_8b.decode_weight_bytes(64) == qwen3_8b.decode_weight_bytes(1)


def test_decode_step_adds_kv_and_bounds_by_flops(qwen3_8b: ModelShape) -> None:
    weights = qwen3_8b.decode_weight_bytes(8)
    assert qwen3_8b.decode_step_bytes(8, 1000) == weights + 8 * 1000 * 147_456
    flops = qwen3_8b.decode_flops(4, 100)
    assert flops == 4 * (2 * qwen3_8b.active_params + 36 * 4 * 32 * 128 * 100)
    memory_s = qwen3_8b.decode_step_s(512, 0, 3.35e12)
    compute_s = qwen3_8b.decode_flops(512, 0) / 1e12
    assert compute_s > memory_s
    assert qwen3_8b.decode_step_s(512, 0, 3.35e12, flops_per_s=1e12) == compute_s
    assert qwen3_8b.decode_tokens_per_s(2, 0, 3.35e12) == 2 / qwen3_8b.decode_step_s(2, 0, 3.35e12)
    with pytest.raises(ValueError, match="batch must be positive"):
        qwen3_8b.decode_step_bytes(0, 10)


def test_mla_attention_flops_use_the_latent(dsv2_lite: ModelShape) -> None:
    assert dsv2_lite.attention_flops_per_token(10) == 27 * 2 * 16 * (2 * 512 + 64) * 10


def test_describe_qwen3_8b_on_h100(qwen3_8b: ModelShape) -> None:
    facts = describe(qwen3_8b, batch=1, hardware=get_hardware("h100"))
    json.dumps(facts)  # JSON-ready
    assert facts["name"] == "qwen3-8b"
    assert facts["family"] == "qwen3"
    assert facts["params"] == 8_190_735_360
    assert facts["weight_bytes"] == 16_381_470_720
    assert facts["kv_bytes_per_token"] == 147_456
    assert facts["expected_experts"] is None
    assert facts["context"] == 0
    assert facts["hardware"] == "h100-sxm"
    assert facts["bound"] == "memory"
    assert facts["decode_step_s_roofline"] == pytest.approx(facts["decode_weight_bytes"] / 3.35e12)
    assert facts["decode_tokens_per_s_roofline"] == pytest.approx(3.35e12 / facts["decode_weight_bytes"])
    assert facts["arithmetic_intensity"] == pytest.approx(1.0, abs=0.01)  # 2 FLOP per 2-byte weight
    assert facts["ridge_flops_per_byte"] == pytest.approx(989e12 / 3.35e12)


def test_describe_moe_with_context(dsv2_lite: ModelShape) -> None:
    facts = describe(dsv2_lite, batch=64, context=1024, kv_dtype="fp8", hardware=get_hardware("h200"))
    assert facts["expected_experts"] == pytest.approx(63.882, abs=1e-3)
    assert facts["decode_step_bytes"] == pytest.approx(facts["decode_weight_bytes"] + 64 * 1024 * 27 * 576)


# ---- errors -------------------------------------------------------------------------------------
def test_unknown_model_type_names_file_and_type(tmp_path: Path) -> None:
    path = write_config(tmp_path, model_type="gpt_neox", hidden_size=8)
    with pytest.raises(ModelError, match=r"config\.json: unknown model_type 'gpt_neox'; known: .*qwen3"):
        load_model(path)


def test_missing_and_bad_keys(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="missing 'hidden_size'"):
        load_model(write_config(tmp_path, model_type="llama"))
    with pytest.raises(ModelError, match="'num_hidden_layers' must be an integer >= 1, got '2'"):
        load_model(write_config(tmp_path, model_type="llama", vocab_size=10, hidden_size=8,
                                num_hidden_layers="2", num_attention_heads=2, intermediate_size=8))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read"):
        load_model(tmp_path / "nowhere")
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n oops}')
    with pytest.raises(ModelError, match=r"config\.json:2: invalid JSON"):
        load_model(tmp_path)  # a folder holding config.json


# ---- hardware -----------------------------------------------------------------------------------
def test_hardware_spec_numbers() -> None:
    h100 = get_hardware("h100-sxm")
    assert (h100.flops_bf16, h100.bandwidth_Bps) == (989e12, 3.35e12)
    assert h100.ridge == pytest.approx(295.2, abs=0.1)
    assert get_hardware("h200").bandwidth_Bps == 4.8e12
    assert get_hardware("a100-80gb").flops_bf16 == 312e12
    assert get_hardware("l40s").bandwidth_Bps == 0.864e12
    assert get_hardware("b200").flops_bf16 == 2.25e15
    assert get_hardware("cpu").source == "nominal"
    assert set(HARDWARE) == {"h100-sxm", "h200", "a100-80gb", "l40s", "b200", "cpu"}


def test_hardware_aliases() -> None:
    assert get_hardware("H100").name == "h100-sxm"
    assert get_hardware("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert get_hardware("nvidia h200").name == "h200"
    assert get_hardware("NVIDIA A100-SXM4-80GB").name == "a100-80gb"


def test_unknown_hardware_lists_known_names() -> None:
    with pytest.raises(HardwareError, match="unknown hardware 'tpu-v5'; known: a100-80gb, b200, cpu") as info:
        get_hardware("tpu-v5")
    assert isinstance(info.value, KeyError)
    assert str(info.value).startswith("unknown hardware")  # not repr-quoted like a bare KeyError


def test_calibrated_hardware_replaces_the_sheet() -> None:
    # The seed's measured ridge: 258 FLOP/byte.
    measured = get_hardware("h100").calibrated(bandwidth_Bps=3.05e12, flops_bf16=787e12)
    assert measured.source == "calibrated"
    assert measured.ridge == pytest.approx(258, abs=0.1)
    assert measured.memory_bytes == get_hardware("h100").memory_bytes
    only_bw = get_hardware("h200").calibrated(bandwidth_Bps=4.246e12)
    assert isinstance(only_bw, Hardware)
    assert (only_bw.bandwidth_Bps, only_bw.flops_bf16) == (4.246e12, 989e12)
    with pytest.raises(ValueError, match="must be positive"):
        get_hardware("h200").calibrated(bandwidth_Bps=0)
