"""Server introspection from text: the root cause of a failed start in vLLM's log, KV capacity from
the log and from /metrics labels, GPU names from collect_env."""

from __future__ import annotations

from runner.measure import prometheus
from runner.server.introspect import (
    _first_gpu_model,
    kv_capacity_from_metrics,
    parse_kv_capacity_log,
    startup_failure,
)

_W = "(Worker pid=12594) ERROR 12-01 01:20:11 [multiproc_executor.py:1063] "
_E = "(EngineCore pid=12542) ERROR 12-01 01:20:11 [core.py:1510] "
_ROOT = (
    "ValueError: Available memory on node 0 (15.0/16.46 GiB) on kv cache allocation is less than requested "
    "memory for kv (4000.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU "
    "memory used by other processes."
)
_QUOTED = _ROOT.split(": ", 1)[1]
# Lines of a real `vllm serve` 0.32 CPU log (multiprocessing on) for a KV cache larger than memory:
# the worker's ValueError, the engine core's wrapper quoting it, the API server's wrapper of that.
KV_TOO_BIG_LOG = "\n".join([
    "(APIServer pid=12447) WARNING 12-01 01:20:01 [system_utils.py:255] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
    "like `OSError: [Errno 24] Too many open files`.",
    "(EngineCore pid=12542) INFO 12-01 01:20:11 [utils.py:347] Using LBHNC KV cache layout.",
    _W + "WorkerProc hit an exception.",
    _W + "Traceback (most recent call last):",
    _W + '  File "/venv/lib/python3.11/site-packages/vllm/v1/worker/cpu_worker.py", line 219, in determine',
    _W + "    raise ValueError(",
    _W + _ROOT,
    _W + "Traceback (most recent call last):",
    _W + '  File "/venv/lib/python3.11/site-packages/vllm/v1/worker/cpu_worker.py", line 219, in determine',
    _W + _ROOT,
    _W,
    _E + "EngineCore failed to start.",
    _E + "Traceback (most recent call last):",
    _E + '  File "/venv/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 444',
    _E + "    raise RuntimeError(",
    _E + f"RuntimeError: Worker failed with error '{_QUOTED}', please check the stack trace above for the root cause",
    "Process EngineCore:",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
    f"RuntimeError: Worker failed with error '{_QUOTED}', please check the stack trace above for the root cause",
    "Traceback (most recent call last):",
    '  File "/venv/bin/vllm", line 8, in <module>',
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear "
    "to be 2 leaked shared_memory objects to clean up at shutdown",
    "  warnings.warn('resource_tracker: There appear to be %d '",
])

# A real max_model_len above the model's: pydantic's one-line summary, then the reason, indented.
MAX_LEN_LOG = "\n".join([
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__',
    "    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
    "  Value error, User-specified max_model_len (1000000) is greater than the derived max_model_len "
    "(max_position_embeddings=4096.0 or model_max_length=None in model's config.json). [type=value_error]",
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
])


def test_root_cause_skips_the_wrappers_and_prefixes() -> None:
    assert startup_failure(KV_TOO_BIG_LOG) == _ROOT


def test_root_cause_keeps_the_indented_reason_of_a_validation_error() -> None:
    got = startup_failure(MAX_LEN_LOG)
    assert got is not None
    first, second = got.split("\n")
    assert first == "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
    assert second.startswith("Value error, User-specified max_model_len (1000000) is greater")
    assert "For further information" not in got


def test_the_last_real_exception_wins_over_an_earlier_one() -> None:
    log = "ImportError: optional thing missing\nloading...\nTraceback (most recent call last):\n" \
          "  File \"x.py\", line 1, in <module>\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    assert startup_failure(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"


def test_only_wrappers_or_nothing() -> None:
    assert startup_failure("INFO all fine\nnothing to see") is None
    assert startup_failure("") is None
    # A wrapper alone names no cause: the caller shows the log's tail instead.
    assert startup_failure("RuntimeError: Engine core initialization failed. See root cause above.") is None
    # Mentions of errors inside a message are not exception lines.
    assert startup_failure("WARNING 12-01 01:20:01 [x.py:1] may cause `OSError: [Errno 24]`") is None


def test_a_bare_exception_without_message() -> None:
    assert startup_failure("Traceback (most recent call last):\n  File \"a\", line 1\nKeyboardInterrupt") == \
        "KeyboardInterrupt"


def test_kv_capacity_log_line_of_a_gpu_server() -> None:
    line = "(EngineCore_DP0 pid=1) INFO 11-29 [kv_cache_utils.py:1087] GPU KV cache size: 407,248 tokens"
    assert parse_kv_capacity_log(line) == 407_248
    assert parse_kv_capacity_log("no such line") is None


def _info(**labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{inner}}} 1.0\n"


def test_kv_capacity_from_metrics_labels() -> None:
    snap = prometheus.parse(_info(engine="0", kv_cache_size_tokens="262144", num_gpu_blocks="8192", block_size="32"))
    assert kv_capacity_from_metrics(snap) == (262_144, "metrics:kv_cache_size_tokens")
    two = prometheus.parse(
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{engine="0",num_gpu_blocks="100",block_size="16"} 1.0\n'
        'vllm:cache_config_info{engine="1",num_gpu_blocks="50",block_size="16"} 1.0\n'
    )
    assert kv_capacity_from_metrics(two) == (2_400, "metrics:blocks")
    assert kv_capacity_from_metrics(prometheus.parse(_info(engine="0", num_gpu_blocks="None", block_size="16"))) == \
        (None, None)
    assert kv_capacity_from_metrics(prometheus.parse("# TYPE vllm:num_requests_running gauge\n"
                                                  "vllm:num_requests_running 0.0\n")) == (None, None)


def test_first_gpu_model() -> None:
    assert _first_gpu_model("GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA H200") == "NVIDIA H200"
    assert _first_gpu_model("NVIDIA H200") == "NVIDIA H200"
    assert _first_gpu_model(None) is None
