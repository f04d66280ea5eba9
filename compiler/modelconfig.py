"""Read a Hugging Face config.json into a `ModelShape`; every failure names the file and the key.

Pure: it reads the config file and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compiler.modelmath import DTYPE_ALIASES, ModelShape


class ModelError(ValueError):
    """A config.json that cannot be read or described; the message names the file and the problem."""


# config.json model_type -> family. Mistral is Llama-shaped for every count made here.
_MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
}


class _Config:
    """Typed reads from one config dict; every failure names the file and the key."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def fail(self, problem: str) -> ModelError:
        return ModelError(f"{self.path}: {problem}")

    def get_int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise self.fail(f"missing {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{key!r} must be an integer >= {minimum}, got {value!r}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key!r} must be true or false, got {value!r}")
        return value


def _config_dtype(cfg: _Config) -> str:
    raw = cfg.data.get("dtype") or cfg.data.get("torch_dtype") or "bfloat16"  # transformers 5 says "dtype"
    dtype = DTYPE_ALIASES.get(raw.lower(), raw.lower()) if isinstance(raw, str) else None
    if dtype not in ("bf16", "fp16", "fp32"):
        raise cfg.fail(f"unsupported dtype {raw!r}; expected bfloat16, float16 or float32")
    return dtype


def _shape_from_config(data: dict[str, Any], path: Path, name: str) -> ModelShape:
    cfg = _Config(data, path)
    model_type = data.get("model_type")
    if model_type not in _MODEL_TYPES:
        known = ", ".join(sorted(_MODEL_TYPES))
        raise cfg.fail(f"unknown model_type {model_type!r}; known: {known}")
    family = _MODEL_TYPES[model_type]
    hidden = cfg.get_int("hidden_size")
    layers = cfg.get_int("num_hidden_layers")
    heads = cfg.get_int("num_attention_heads")
    common: dict[str, Any] = {
        "name": name,
        "family": family,
        "vocab_size": cfg.get_int("vocab_size"),
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": cfg.get_int("num_key_value_heads", heads),
        "head_dim": cfg.get_int("head_dim", hidden // heads),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", False),
        "dtype": _config_dtype(cfg),
    }
    attention_bias = cfg.get_bool("attention_bias", False)
    if family in ("llama", "qwen3"):
        return ModelShape(
            **common,
            intermediate_size=cfg.get_int("intermediate_size"),
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=cfg.get_bool("mlp_bias", False),
            qk_norm=family == "qwen3",
        )
    if family == "qwen2":  # q, k and v always carry a bias; o does not
        return ModelShape(**common, intermediate_size=cfg.get_int("intermediate_size"), qkv_bias=True)
    if family == "qwen3_moe":
        experts = cfg.get_int("num_experts", 0, minimum=0)
        step = cfg.get_int("decoder_sparse_step", 1)
        dense_only = data.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
            raise cfg.fail(f"'mlp_only_layers' must be a list of layer indices, got {dense_only!r}")
        moe_layers = sum(
            1 for i in range(layers) if experts > 0 and i not in dense_only and (i + 1) % step == 0
        )
        return ModelShape(
            **common,
            intermediate_size=cfg.get_int("intermediate_size", 0, minimum=0),
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            qk_norm=True,
            num_experts=experts,
            experts_per_token=cfg.get_int("num_experts_per_tok") if experts else 0,
            moe_intermediate_size=cfg.get_int("moe_intermediate_size") if experts else 0,
            num_moe_layers=moe_layers,
        )
    if family == "mixtral":
        width = cfg.get_int("intermediate_size")
        return ModelShape(
            **common,
            intermediate_size=0,
            num_experts=cfg.get_int("num_local_experts"),
            experts_per_token=cfg.get_int("num_experts_per_tok"),
            moe_intermediate_size=width,
            num_moe_layers=layers,
        )
    # DeepSeek-V2/V3: MLA attention, first_k_dense_replace dense layers, then routed + shared experts.
    experts = cfg.get_int("n_routed_experts", 0, minimum=0)
    first_dense = cfg.get_int("first_k_dense_replace", 0, minimum=0)
    freq = cfg.get_int("moe_layer_freq", 1)
    moe_layers = sum(1 for i in range(layers) if experts > 0 and i >= first_dense and i % freq == 0)
    moe_width = cfg.get_int("moe_intermediate_size") if experts else 0
    return ModelShape(
        **common,
        intermediate_size=cfg.get_int("intermediate_size"),
        q_lora_rank=cfg.get_int("q_lora_rank", 0, minimum=0),
        kv_lora_rank=cfg.get_int("kv_lora_rank"),
        qk_nope_head_dim=cfg.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.get_int("qk_rope_head_dim"),
        v_head_dim=cfg.get_int("v_head_dim"),
        num_experts=experts,
        experts_per_token=cfg.get_int("num_experts_per_tok") if experts else 0,
        moe_intermediate_size=moe_width,
        shared_intermediate_size=cfg.get_int("n_shared_experts", 0, minimum=0) * moe_width,
        router_bias=data.get("topk_method") == "noaux_tc",
        num_moe_layers=moe_layers,
    )


def load_model(path: str | Path) -> ModelShape:
    """Read a config.json, or the config.json inside a folder. The shape is named after its folder."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelError(f"{file}: cannot read: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelError(f"{file}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{file}: expected a JSON object, got {type(data).__name__}")
    name = file.resolve().parent.name
    return _shape_from_config(data, file, name)
