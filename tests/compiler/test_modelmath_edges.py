"""Model math at its edges: config defaults, layer counts, dtype spellings, bounds and messages.

Each shape read from a config.json is compared field by field with the one the config means, so a
default read wrong (a missing key, a zero, a layer index off by one) shows as a named field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from compiler.hardware import Hardware
from compiler.modelconfig import ModelError, load_model
from compiler.modelmath import ModelShape, describe

MODELS = Path(__file__).resolve().parents[2] / "models"


def shape_of(tmp_path: Path, **config: Any) -> ModelShape:
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return load_model(folder)


def base(model_type: str, **extra: Any) -> dict[str, Any]:
    return {"model_type": model_type, "vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 5,
            "num_attention_heads": 4, **extra}


def common(family: str, **extra: Any) -> dict[str, Any]:
    """The ModelShape fields every family fills from `base`."""
    fields: dict[str, Any] = {"name": "m", "family": family, "vocab_size": 100, "hidden_size": 16,
                              "num_layers": 5, "num_heads": 4, "num_kv_heads": 4, "head_dim": 4,
                              "tie_word_embeddings": False, "dtype": "bf16"}
    return {**fields, **extra}


@pytest.fixture(scope="module")
def tiny() -> ModelShape:
    return load_model(MODELS / "tiny-qwen3")


# ---- config.json: defaults and every field ------------------------------------------------------
def test_llama_defaults(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("llama", intermediate_size=32))
    assert shape == ModelShape(**common("llama"), intermediate_size=32)
    assert shape.tie_word_embeddings is False and shape.qkv_bias is False and shape.mlp_bias is False


def test_qwen3_reads_flags_and_norms(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("qwen3", intermediate_size=32, attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=True, num_key_value_heads=2, head_dim=8))
    assert shape == ModelShape(**common("qwen3", tie_word_embeddings=True, num_kv_heads=2, head_dim=8),
                               intermediate_size=32, qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=True)


def test_head_dim_defaults_to_integer_division(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **{**base("llama", intermediate_size=8), "hidden_size": 10})
    assert shape.head_dim == 2 and isinstance(shape.head_dim, int)  # 10 // 4, not 2.5


def test_qwen3_moe_all_layers_routed_by_default(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                      moe_intermediate_size=12))
    assert shape == ModelShape(**common("qwen3_moe"), intermediate_size=0, qk_norm=True, num_experts=8,
                               experts_per_token=2, moe_intermediate_size=12, num_moe_layers=5)


def test_qwen3_moe_odd_layer_count_and_sparse_step(tmp_path: Path) -> None:
    # Layers 0..4, every third layer routed counting from 1: only index 2 (layer 3). Index 5 is past the end.
    moe = base("qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
               intermediate_size=24, decoder_sparse_step=3)
    assert shape_of(tmp_path, **moe).num_moe_layers == 1
    assert shape_of(tmp_path, **{**moe, "decoder_sparse_step": 2}).num_moe_layers == 2  # indices 1, 3
    assert shape_of(tmp_path, **{**moe, "decoder_sparse_step": 1}).num_moe_layers == 5
    assert shape_of(tmp_path, **{**moe, "decoder_sparse_step": 1, "mlp_only_layers": [0, 4]}).num_moe_layers == 3
    assert shape_of(tmp_path, **{**moe, "mlp_only_layers": [2]}).num_moe_layers == 0


def test_qwen3_moe_one_expert_still_routes(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("qwen3_moe", num_experts=1, num_experts_per_tok=1,
                                      moe_intermediate_size=12))
    assert shape.num_moe_layers == 5 and shape.is_moe


def test_qwen3_moe_without_experts_is_dense(tmp_path: Path) -> None:
    # No expert keys at all: a dense Qwen3-MoE config must not ask for them.
    shape = shape_of(tmp_path, **base("qwen3_moe", intermediate_size=24, attention_bias=True))
    assert shape == ModelShape(**common("qwen3_moe"), intermediate_size=24, qkv_bias=True, o_bias=True,
                               qk_norm=True)
    zero = shape_of(tmp_path, **base("qwen3_moe", intermediate_size=24, num_experts=0))
    assert zero.num_experts == 0 and zero.num_moe_layers == 0 and zero.experts_per_token == 0


def test_qwen3_moe_accepts_zero_dense_width(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("qwen3_moe", num_experts=4, num_experts_per_tok=1,
                                      moe_intermediate_size=12, intermediate_size=0))
    assert shape.intermediate_size == 0


def test_qwen3_moe_mlp_only_layers_must_be_indices(tmp_path: Path) -> None:
    for bad in (["0"], 3):
        with pytest.raises(ModelError, match=r"config\.json: 'mlp_only_layers' must be a list of layer "
                                             r"indices, got "):
            shape_of(tmp_path, **base("qwen3_moe", num_experts=4, num_experts_per_tok=1,
                                      moe_intermediate_size=12, mlp_only_layers=bad))


def test_mixtral_has_no_dense_mlp(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **base("mixtral", intermediate_size=32, num_local_experts=4,
                                      num_experts_per_tok=2))
    assert shape == ModelShape(**common("mixtral"), intermediate_size=0, num_experts=4, experts_per_token=2,
                               moe_intermediate_size=32, num_moe_layers=5)


def mla(**extra: Any) -> dict[str, Any]:
    return base("deepseek_v2", intermediate_size=32, kv_lora_rank=8, qk_nope_head_dim=4,
                qk_rope_head_dim=2, v_head_dim=4, **extra)


MLA_FIELDS: dict[str, Any] = {"intermediate_size": 32, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
              "v_head_dim": 4}


def test_deepseek_dense_needs_no_expert_keys(tmp_path: Path) -> None:
    assert shape_of(tmp_path, **mla()) == ModelShape(**common("deepseek_v2"), **MLA_FIELDS)
    explicit = shape_of(tmp_path, **mla(n_routed_experts=0, first_k_dense_replace=0, q_lora_rank=0,
                                        n_shared_experts=0))
    assert explicit == ModelShape(**common("deepseek_v2"), **MLA_FIELDS)


def test_deepseek_routed_layers_from_the_first_and_by_frequency(tmp_path: Path) -> None:
    moe = mla(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=6)
    shape = shape_of(tmp_path, **moe)
    assert shape == ModelShape(**common("deepseek_v2"), **MLA_FIELDS, num_experts=8, experts_per_token=2,
                               moe_intermediate_size=6, num_moe_layers=5)
    assert shape_of(tmp_path, **{**moe, "first_k_dense_replace": 1}).num_moe_layers == 4
    assert shape_of(tmp_path, **{**moe, "first_k_dense_replace": 0}).num_moe_layers == 5
    assert shape_of(tmp_path, **{**moe, "moe_layer_freq": 2}).num_moe_layers == 3  # 0, 2, 4
    assert shape_of(tmp_path, **{**moe, "moe_layer_freq": 2, "first_k_dense_replace": 1}).num_moe_layers == 2
    one = shape_of(tmp_path, **{**moe, "n_routed_experts": 1, "num_experts_per_tok": 1})
    assert one.num_moe_layers == 5


def test_deepseek_shared_experts_router_bias_and_q_lora(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, **mla(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=6,
                                     n_shared_experts=2, topk_method="noaux_tc", q_lora_rank=3))
    assert shape.shared_intermediate_size == 12 and shape.router_bias is True and shape.q_lora_rank == 3
    greedy = shape_of(tmp_path, **mla(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=6,
                                      topk_method="greedy"))
    assert greedy.router_bias is False and greedy.shared_intermediate_size == 0 and greedy.q_lora_rank == 0


def test_config_dtype_keys_and_spellings(tmp_path: Path) -> None:
    cfg = base("llama", intermediate_size=8)
    assert shape_of(tmp_path, **cfg).dtype == "bf16"
    assert shape_of(tmp_path, **cfg, dtype="float16").dtype == "fp16"  # transformers 5
    assert shape_of(tmp_path, **cfg, torch_dtype="float32").dtype == "fp32"
    assert shape_of(tmp_path, **cfg, dtype="float16", torch_dtype="float32").dtype == "fp16"
    assert shape_of(tmp_path, **cfg, torch_dtype="BFloat16").dtype == "bf16"
    assert shape_of(tmp_path, **cfg, torch_dtype="bf16").dtype == "bf16"
    assert shape_of(tmp_path, **cfg, torch_dtype="fp16").dtype == "fp16"
    assert shape_of(tmp_path, **cfg, torch_dtype="fp32").dtype == "fp32"
    for bad in ("int8", 16):
        with pytest.raises(ModelError, match=rf"config\.json: unsupported dtype {bad!r}; expected bfloat16, "
                                             "float16 or float32"):
            shape_of(tmp_path, **cfg, torch_dtype=bad)


def test_bool_keys_must_be_booleans(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"config\.json: 'tie_word_embeddings' must be true or false, got 1"):
        shape_of(tmp_path, **base("llama", intermediate_size=8, tie_word_embeddings=1))
    assert shape_of(tmp_path, **base("llama", intermediate_size=8, attention_bias=None)).qkv_bias is False


def test_unknown_model_type_lists_every_known_one(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as err:
        shape_of(tmp_path, model_type="gpt2")
    assert str(err.value).endswith(
        "unknown model_type 'gpt2'; known: deepseek_v2, deepseek_v3, llama, mistral, mixtral, qwen2, "
        "qwen3, qwen3_moe")


def test_load_model_messages_and_name(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config.json"
    with pytest.raises(ModelError) as err:
        load_model(missing)
    assert str(err.value) == f"{missing}: cannot read: No such file or directory"
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ModelError) as err:
        load_model(listed)
    assert str(err.value) == f"{listed}: expected a JSON object, got list"
    assert load_model(MODELS / "tiny-qwen3" / "config.json").name == "tiny-qwen3"


# ---- dtypes --------------------------------------------------------------------------------------
def test_weight_dtype_spellings(tiny: ModelShape) -> None:
    assert tiny.weight_bytes() == tiny.weight_bytes("bf16") == tiny.weight_bytes("bfloat16") == 2 * tiny.params
    assert tiny.weight_bytes("Float32") == tiny.weight_bytes("float") == 4 * tiny.params
    assert tiny.weight_bytes("half") == 2 * tiny.params
    assert tiny.untied_weight_bytes() == 2 * tiny.untied_params
    assert tiny.untied_weight_bytes("int4") == math.ceil(0.5 * tiny.untied_params)
    with pytest.raises(ValueError) as err:
        tiny.weight_bytes("e5m2")
    assert str(err.value) == "unknown dtype 'e5m2'; known: fp32, bf16, fp16, fp8, int8, int4"


def test_kv_dtype_spellings(tiny: ModelShape) -> None:
    per_elem = 2 * 2 * 2 * 64  # layers x K,V x KV heads x head_dim
    for kv, size in (("auto", 2), ("AUTO", 2), ("bf16", 2), ("bfloat16", 2), ("fp16", 2), ("float16", 2),
                     ("half", 2), ("fp32", 4), ("float32", 4), ("fp8", 1), ("fp8_e5m2", 1), ("fp8_inc", 1)):
        assert tiny.kv_bytes_per_token(kv) == per_elem * size, kv
    assert tiny.kv_bytes_per_token() == per_elem * 2
    with pytest.raises(ValueError) as err:
        tiny.kv_bytes_per_token("int8")
    assert str(err.value) == "unknown kv dtype 'int8'; known: auto, bfloat16, float16, float32, fp8"


def test_fp32_checkpoint_serves_16_bit_kv_by_default(tmp_path: Path) -> None:
    fp32 = shape_of(tmp_path, **base("llama", intermediate_size=8, torch_dtype="float32"))
    fp16 = shape_of(tmp_path, **base("llama", intermediate_size=8, torch_dtype="float16"))
    per_elem = 2 * 5 * 4 * 4
    assert fp32.kv_bytes_per_token() == fp32.kv_bytes_per_token("auto") == per_elem * 2
    assert fp32.kv_bytes_per_token("float32") == per_elem * 4
    assert fp16.kv_bytes_per_token("auto") == per_elem * 2


# ---- decode: load checks, defaults, bounds --------------------------------------------------------
def test_negative_context_is_refused_everywhere(tiny: ModelShape) -> None:
    for call in (lambda: tiny.decode_step_bytes(1, -1), lambda: tiny.decode_flops(1, -1),
                 lambda: tiny.decode_step_s(1, -1, 1e9), lambda: tiny.arithmetic_intensity(1, -0.5)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value).startswith("context must be zero or more tokens, got -")
    with pytest.raises(ValueError, match=r"^context must be zero or more tokens, got -1$"):
        tiny.decode_step_bytes(1, -1)
    assert tiny.decode_step_bytes(1, 0) == tiny.decode_weight_bytes(1)  # zero context is a load


def test_batch_must_be_positive(tiny: ModelShape) -> None:
    for batch in (0, -1):
        with pytest.raises(ValueError, match=rf"^batch must be positive, got {batch}$"):
            tiny.decode_weight_bytes(batch)
    assert tiny.decode_weight_bytes(0.5) == tiny.decode_weight_bytes(1)


def test_defaults_match_bf16_and_auto(tiny: ModelShape) -> None:
    assert tiny.decode_weight_bytes(2) == tiny.decode_weight_bytes(2, "bf16") == 2 * tiny._decode_params(2)
    assert tiny.decode_step_bytes(2, 10) == tiny.decode_step_bytes(2, 10, "bf16", "auto")
    assert tiny.decode_step_bytes(2, 10, "fp8", "fp8") == tiny.decode_weight_bytes(2, "fp8") + 2 * 10 * 512
    assert tiny.decode_step_bytes(2, 10, "fp32") == tiny.decode_weight_bytes(2, "fp32") + 2 * 10 * 1024
    assert tiny.arithmetic_intensity(2, 10) == tiny.arithmetic_intensity(2, 10, "bf16", "auto")
    assert tiny.arithmetic_intensity(2, 10, "fp32", "fp8") == pytest.approx(
        tiny.decode_flops(2, 10) / (tiny.decode_weight_bytes(2, "fp32") + 2 * 10 * 512))
    assert tiny.decode_step_s(2, 10, 1e9) == tiny.decode_step_s(2, 10, 1e9, "bf16", "auto")
    assert tiny.decode_step_s(2, 10, 1e9, "bf16", "fp8") == pytest.approx(
        (tiny.decode_weight_bytes(2) + 2 * 10 * 512) / 1e9)
    assert tiny.decode_tokens_per_s(2, 10, 1e9) == 2 / tiny.decode_step_s(2, 10, 1e9)


def test_bandwidth_and_flops_must_be_positive(tiny: ModelShape) -> None:
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=rf"^bandwidth must be positive, got {bad}$"):
            tiny.decode_step_s(1, 0, bad)
        with pytest.raises(ValueError, match=rf"^flops_per_s must be positive, got {bad}$"):
            tiny.decode_step_s(1, 0, 1e9, flops_per_s=bad)
    # Below one byte or FLOP per second is slow, not invalid.
    assert tiny.decode_step_s(1, 0, 0.5) == tiny.decode_weight_bytes(1) / 0.5
    assert tiny.decode_step_s(1, 0, 1e30, flops_per_s=0.5) == tiny.decode_flops(1, 0) / 0.5


def test_tokens_per_s_takes_the_compute_roof(tiny: ModelShape) -> None:
    memory = tiny.decode_tokens_per_s(4, 0, 1e30)
    compute = tiny.decode_tokens_per_s(4, 0, 1e30, flops_per_s=1e6)
    assert compute == pytest.approx(4 / (tiny.decode_flops(4, 0) / 1e6))
    assert compute < memory
    assert tiny.decode_tokens_per_s(4, 0, 1e9, "fp8", "auto", 1e30) == pytest.approx(
        4 / (tiny.decode_weight_bytes(4, "fp8") / 1e9))


# ---- describe -------------------------------------------------------------------------------------
def expected_facts(shape: ModelShape, hw: Hardware, batch: float, ctx: float, dtype: str, kv: str,
                   canonical: str) -> dict[str, Any]:
    memory_s = shape.decode_step_bytes(batch, ctx, dtype, kv) / hw.bandwidth_Bps
    step_s = max(memory_s, shape.decode_flops(batch, ctx) / hw.flops_bf16)
    return {
        "name": shape.name, "family": shape.family, "params": shape.params,
        "non_embedding_params": shape.non_embedding_params, "untied_params": shape.untied_params,
        "active_params": shape.active_params, "dtype": canonical, "kv_dtype": kv,
        "weight_bytes": shape.weight_bytes(dtype), "untied_weight_bytes": shape.untied_weight_bytes(dtype),
        "kv_bytes_per_token": shape.kv_bytes_per_token(kv), "batch": batch, "context": ctx,
        "expected_experts": shape.expected_experts(batch),
        "decode_weight_bytes": shape.decode_weight_bytes(batch, dtype),
        "decode_step_bytes": shape.decode_step_bytes(batch, ctx, dtype, kv),
        "decode_flops": shape.decode_flops(batch, ctx),
        "arithmetic_intensity": shape.arithmetic_intensity(batch, ctx, dtype, kv),
        "hardware": hw.name, "hardware_source": hw.source, "bandwidth_Bps": hw.bandwidth_Bps,
        "flops_per_s": hw.flops_bf16, "ridge_flops_per_byte": hw.ridge,
        "bound": "compute" if step_s > memory_s else "memory",
        "decode_step_s_roofline": step_s, "decode_tokens_per_s_roofline": batch / step_s,
    }


def test_describe_defaults_every_key(tiny: ModelShape) -> None:
    hw = Hardware("card", flops_bf16=1e15, bandwidth_Bps=1e9, memory_bytes=1 << 30, source="calibrated")
    facts = describe(tiny, hardware=hw)
    assert facts == expected_facts(tiny, hw, 1, 0.0, "bf16", "auto", "bf16")
    assert facts["bound"] == "memory" and facts["batch"] == 1


def test_describe_compute_bound_with_other_dtypes(tiny: ModelShape) -> None:
    hw = Hardware("slow", flops_bf16=1e6, bandwidth_Bps=1e12, memory_bytes=1 << 30)
    facts = describe(tiny, batch=8, context=100, dtype="float32", kv_dtype="fp8", hardware=hw)
    assert facts == expected_facts(tiny, hw, 8, 100.0, "float32", "fp8", "fp32")
    assert facts["bound"] == "compute"
    assert facts["decode_step_s_roofline"] == tiny.decode_flops(8, 100) / 1e6


def test_describe_bound_compares_like_with_like_kv(tiny: ModelShape) -> None:
    # Compute time set between the fp8-KV and the 16-bit-KV memory times: the step is compute bound
    # only when the memory time is taken with the same KV dtype as the step.
    fp8 = tiny.decode_step_bytes(8, 4000, "bf16", "fp8")
    auto = tiny.decode_step_bytes(8, 4000, "bf16", "auto")
    hw = Hardware("mid", flops_bf16=tiny.decode_flops(8, 4000) / ((fp8 + auto) / 2), bandwidth_Bps=1.0,
                  memory_bytes=1 << 30)
    facts = describe(tiny, batch=8, context=4000, kv_dtype="fp8", hardware=hw)
    assert facts["bound"] == "compute"
    assert fp8 < facts["decode_step_s_roofline"] < auto
