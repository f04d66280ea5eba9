"""Model math of a `ModelShape`: parameters, weight and KV bytes, decode roofline, and where a measured
decode point sits on a card's roofline.

Pure: no file is read here (`compiler.modelconfig` reads config.json into a `ModelShape`). Prediction
expressions (`compiler.predict_env`) and `studyc` reports use these numbers as the "predict first" half
of predict-then-measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.hardware import Hardware

BYTES_PER_PARAM: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
# vLLM's --kv-cache-dtype values (fp8 variants are one byte per element).
_KV_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


def _canonical_dtype(dtype: str) -> str:
    d = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if d not in BYTES_PER_PARAM:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(BYTES_PER_PARAM)}")
    return d


def _check_load(batch: float, context: float = 0) -> None:
    if not batch > 0:
        raise ValueError(f"batch must be positive, got {batch!r}")
    if not context >= 0:
        raise ValueError(f"context must be zero or more tokens, got {context!r}")


@dataclass(frozen=True)
class ModelShape:
    """Everything the math needs from config.json. Counts are parameters; bytes depend on a dtype.

    Attention is MLA when `kv_lora_rank` > 0 (DeepSeek), else MHA/GQA. The model is a mixture of
    experts when `num_experts` > 0; then `num_moe_layers` layers carry routed experts (plus
    `shared_intermediate_size` of always-on shared experts) and the rest a dense MLP.
    """

    name: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (0 when no layer is dense)
    tie_word_embeddings: bool
    dtype: str  # the checkpoint's dtype: "bf16", "fp16" or "fp32"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMSNorm of head_dim on q and on k in every layer
    # MLA
    q_lora_rank: int = 0  # 0: q is projected directly from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0  # width of one routed expert
    shared_intermediate_size: int = 0  # total width of the shared experts in one MoE layer
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias
    num_moe_layers: int = 0

    # ---- parameter counts -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def attention_params(self) -> int:
        """One layer's attention block, projections, biases and q/k norms included."""
        h, heads = self.hidden_size, self.num_heads
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:  # q_a_proj, q_a_layernorm, q_b_proj
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk_dim
            else:
                q = h * heads * qk_dim
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # + kv_a_layernorm
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + heads * self.v_head_dim * h
        q_out, kv_out = heads * self.head_dim, self.num_kv_heads * self.head_dim
        n = 2 * h * q_out + 2 * h * kv_out
        n += (q_out + 2 * kv_out) if self.qkv_bias else 0
        n += h if self.o_bias else 0
        n += 2 * self.head_dim if self.qk_norm else 0
        return n

    def _mlp_params(self, width: int, bias: bool = False) -> int:
        """A gated (SwiGLU) MLP: gate, up and down projections."""
        return 3 * self.hidden_size * width + ((2 * width + self.hidden_size) if bias else 0)

    @property
    def expert_params(self) -> int:
        """One routed expert (0 for a dense model)."""
        return self._mlp_params(self.moe_intermediate_size) if self.is_moe else 0

    @property
    def _moe_always_params(self) -> int:
        """What every MoE layer reads whatever the routing: shared experts and the router."""
        shared = self._mlp_params(self.shared_intermediate_size) if self.shared_intermediate_size else 0
        router = self.num_experts * self.hidden_size + (self.num_experts if self.router_bias else 0)
        return shared + router

    @property
    def _body_params(self) -> int:
        """All parameters except the embedding, lm_head and routed experts."""
        dense_layers = self.num_layers - self.num_moe_layers
        per_layer = self.attention_params + 2 * self.hidden_size  # + input and post-attention norms
        return (
            self.num_layers * per_layer
            + dense_layers * self._mlp_params(self.intermediate_size, self.mlp_bias)
            + self.num_moe_layers * self._moe_always_params
            + self.hidden_size  # final norm
        )

    @property
    def params(self) -> int:
        """Total parameters as the model holds them: a tied embedding and lm_head count once."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        routed = self.num_moe_layers * self.num_experts * self.expert_params
        return self.embedding_params + lm_head + self._body_params + routed

    @property
    def untied_params(self) -> int:
        """Parameters with the lm_head counted apart from the embedding even when tied.

        Some published checkpoints store both matrices anyway (Qwen3-0.6B's safetensors hold
        lm_head.weight: 0.75 B parameters, 1.40 GiB at bf16); the engine still loads one.
        """
        return self.params + (self.embedding_params if self.tie_word_embeddings else 0)

    @property
    def non_embedding_params(self) -> int:
        """Parameters without the input embedding (a tied lm_head goes with it)."""
        return self.params - self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token's decode step reads: no embedding rows, lm_head, k routed experts."""
        return round(self._decode_params(1.0))

    # ---- bytes ------------------------------------------------------------------------------
    def weight_bytes(self, dtype: str = "bf16") -> int:
        """All parameters at one dtype (norms and embedding included, as a simple upper count)."""
        return math.ceil(self.params * BYTES_PER_PARAM[_canonical_dtype(dtype)])

    def untied_weight_bytes(self, dtype: str = "bf16") -> int:
        return math.ceil(self.untied_params * BYTES_PER_PARAM[_canonical_dtype(dtype)])

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """KV cache bytes one token occupies across all layers.

        MHA/GQA stores K and V per KV head; MLA stores one latent plus the shared rope key.
        "auto" is the serving dtype: the checkpoint's, except that vLLM serves fp32 checkpoints
        in 16-bit by default. Sliding windows are ignored.
        """
        elem = self._kv_element_bytes(kv_dtype)
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def _kv_element_bytes(self, kv_dtype: str) -> int:
        k = kv_dtype.lower()
        if k == "auto":
            return 2 if self.dtype == "fp32" else int(BYTES_PER_PARAM[self.dtype])
        if k in _KV_FP8:
            return 1
        d = DTYPE_ALIASES.get(k, k)
        if d in ("bf16", "fp16", "fp32"):
            return int(BYTES_PER_PARAM[d])
        raise ValueError(f"unknown kv dtype {kv_dtype!r}; known: auto, bfloat16, float16, float32, fp8")

    # ---- decode -----------------------------------------------------------------------------
    def expected_experts(self, batch: float) -> float | None:
        """Distinct routed experts one MoE layer reads for `batch` tokens under uniform routing:
        E * (1 - (1 - k/E)^B). None for a dense model."""
        if not self.is_moe:
            return None
        _check_load(batch)
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - math.pow(1.0 - k / e, batch))

    def _decode_params(self, batch: float) -> float:
        # The lm_head is read every step; tied, it is the embedding matrix, which `params` already
        # holds once. Untied, the embedding's rows are looked up, not streamed, so leave them out.
        lm_head_and_body = self.params - (0 if self.tie_word_embeddings else self.embedding_params)
        if not self.is_moe:
            return float(lm_head_and_body)
        routed_all = self.num_moe_layers * self.num_experts * self.expert_params
        experts = self.expected_experts(batch) or 0.0
        return lm_head_and_body - routed_all + self.num_moe_layers * experts * self.expert_params

    def decode_weight_bytes(self, batch: float, dtype: str = "bf16") -> float:
        """Weight bytes one decode step reads at batch B: routed experts by their expected union,
        shared experts, dense layers and the lm_head always, embedding rows never."""
        _check_load(batch)
        return self._decode_params(batch) * BYTES_PER_PARAM[_canonical_dtype(dtype)]

    def decode_step_bytes(
        self, batch: float, context: float, dtype: str = "bf16", kv_dtype: str = "auto"
    ) -> float:
        """Weights plus the KV cache of `batch` sequences each `context` tokens long."""
        _check_load(batch, context)
        kv = batch * context * self.kv_bytes_per_token(kv_dtype)
        return self.decode_weight_bytes(batch, dtype) + kv

    def attention_flops_per_token(self, context: float) -> float:
        """Score and value FLOPs of one new token against `context` cached tokens, all layers.

        MLA is counted in its absorbed decode form: scores over the latent plus rope key, values
        over the latent.
        """
        if self.is_mla:
            per_position = 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            per_position = 4 * self.num_heads * self.head_dim
        return self.num_layers * per_position * context

    def decode_flops(self, batch: float, context: float) -> float:
        """FLOPs of one decode step: 2 per active parameter per token, plus attention."""
        _check_load(batch, context)
        return batch * (2.0 * self.active_params + self.attention_flops_per_token(context))

    def arithmetic_intensity(
        self, batch: float, context: float, dtype: str = "bf16", kv_dtype: str = "auto"
    ) -> float:
        """FLOP per byte moved in one decode step."""
        return self.decode_flops(batch, context) / self.decode_step_bytes(batch, context, dtype, kv_dtype)

    def decode_step_s(
        self,
        batch: float,
        context: float,
        bandwidth_Bps: float,
        dtype: str = "bf16",
        kv_dtype: str = "auto",
        flops_per_s: float | None = None,
    ) -> float:
        """Roofline time of one decode step: bytes / bandwidth, or flops / flops_per_s if slower."""
        if not bandwidth_Bps > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth_Bps!r}")
        memory_s = self.decode_step_bytes(batch, context, dtype, kv_dtype) / bandwidth_Bps
        if flops_per_s is None:
            return memory_s
        if not flops_per_s > 0:
            raise ValueError(f"flops_per_s must be positive, got {flops_per_s!r}")
        return max(memory_s, self.decode_flops(batch, context) / flops_per_s)

    def decode_tokens_per_s(
        self,
        batch: float,
        context: float,
        bandwidth_Bps: float,
        dtype: str = "bf16",
        kv_dtype: str = "auto",
        flops_per_s: float | None = None,
    ) -> float:
        """Roofline output tokens per second of the whole batch."""
        return batch / self.decode_step_s(batch, context, bandwidth_Bps, dtype, kv_dtype, flops_per_s)


def describe(
    shape: ModelShape,
    *,
    batch: float = 1,
    context: float | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "auto",
    hardware: Hardware,
) -> dict[str, Any]:
    """A JSON-ready summary of the model on one card at one decode point.

    `context` None means 0 cached tokens: the weight-streaming ceiling, with no KV read.
    The roofline takes the slower of memory time and compute time.
    """
    ctx = 0.0 if context is None else float(context)
    step_s = shape.decode_step_s(batch, ctx, hardware.bandwidth_Bps, dtype, kv_dtype, hardware.flops_bf16)
    memory_s = shape.decode_step_s(batch, ctx, hardware.bandwidth_Bps, dtype, kv_dtype)
    return {
        "name": shape.name,
        "family": shape.family,
        "params": shape.params,
        "non_embedding_params": shape.non_embedding_params,
        "untied_params": shape.untied_params,
        "active_params": shape.active_params,
        "dtype": _canonical_dtype(dtype),
        "kv_dtype": kv_dtype,
        "weight_bytes": shape.weight_bytes(dtype),
        "untied_weight_bytes": shape.untied_weight_bytes(dtype),
        "kv_bytes_per_token": shape.kv_bytes_per_token(kv_dtype),
        "batch": batch,
        "context": ctx,
        "expected_experts": shape.expected_experts(batch),
        "decode_weight_bytes": shape.decode_weight_bytes(batch, dtype),
        "decode_step_bytes": shape.decode_step_bytes(batch, ctx, dtype, kv_dtype),
        "decode_flops": shape.decode_flops(batch, ctx),
        "arithmetic_intensity": shape.arithmetic_intensity(batch, ctx, dtype, kv_dtype),
        "hardware": hardware.name,
        "hardware_source": hardware.source,
        "bandwidth_Bps": hardware.bandwidth_Bps,
        "flops_per_s": hardware.flops_bf16,
        "ridge_flops_per_byte": hardware.ridge,
        "bound": "compute" if step_s > memory_s else "memory",
        "decode_step_s_roofline": step_s,
        "decode_tokens_per_s_roofline": batch / step_s,
    }


# -- roofline placement of a measured decode point ---------------------------------------------------


@dataclass(frozen=True)
class RooflinePlacement:
    """Where the model math places a measured decode point on a card's roofline."""

    intensity: float  # decode FLOPs / bytes read per step
    flops_per_s: float  # FLOPs per token x measured output tokens/s
    fraction: float  # of the card's roofline at this intensity


def roofline_flops_per_s(hw: Hardware, intensity: float) -> float:
    """The roofline at `intensity` FLOPs/byte: min(peak bf16 FLOP/s, bandwidth x intensity)."""
    return min(hw.flops_bf16, hw.bandwidth_Bps * intensity)


def decode_placement(shape: ModelShape, dtype: str, kv_dtype: str, hw: Hardware, batch: float, context: float,
                     tokens_per_s: float) -> RooflinePlacement:
    """One decode step at `batch` sequences in flight and `context` tokens each: intensity = FLOPs /
    bytes read (weights + KV), attained = FLOPs per token x measured output tokens/s."""
    flops = shape.decode_flops(batch, context)
    intensity = flops / shape.decode_step_bytes(batch, context, dtype, kv_dtype)
    attained = flops / batch * tokens_per_s
    return RooflinePlacement(intensity, attained, attained / roofline_flops_per_s(hw, intensity))
