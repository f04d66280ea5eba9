"""A `vllm serve` start held after its imports, run by the engine's own interpreter:

    PYTHON held.py ARGV...

It imports what vLLM's API process imports (torch, transformers, the CLI, the API server, the engine
client), prints one `# studyc-held:` line, then waits for a line on standard input: `go` runs the CLI as
`vllm ARGV...`; anything else, or the end of the input, exits. So the API process's imports (19-28 s of a
start on the H200 host) run while the launch before it starts and measures, and its own start begins at
`go`. Nothing here may touch a GPU (a CUDA context would hold memory beside the launch being measured):
if an import started CUDA, it says so and exits, and the runner starts that server cold.

Standard library only, since it runs in the engine's environment, not studyc's.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import time

# What the API process imports, in that order; a module missing from this vLLM version is skipped. The
# engine core is not helped: vLLM's CLI spawns it (`cli_env_setup`), and a spawned process imports anew.
MODULES = (
    "torch",
    "transformers",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core_client",
)
# What the engine core imports besides: worth importing here only when the engine core is forked from this
# process (VLLM_WORKER_MULTIPROC_METHOD=fork, an arm's `env`), so that it inherits them. A module that
# fails on this platform is skipped; one that started CUDA makes the held start exit (`cuda_initialized`).
ENGINE_CORE_MODULES = (
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.models.qwen3_moe",
    "vllm.model_executor.models.deepseek_v2",
    "vllm.model_executor.models.llama",
)


def modules(environ: dict[str, str]) -> list[str]:
    """The modules to import while held: the API process's, and the engine core's when it will be forked."""
    forked = environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork"
    return [*MODULES, *(ENGINE_CORE_MODULES if forked else ())]


def preimport(names: list[str]) -> tuple[int, list[str]]:
    """Import each module it can: (how many imported, those that failed)."""
    done, failed = 0, []
    for name in names:
        try:
            importlib.import_module(name)
            done += 1
        except Exception:
            failed.append(name)
    return done, failed


def cuda_initialized() -> bool:
    """Whether an import started CUDA in this process: torch's context, or the driver itself (a driver call
    before `cuInit` answers CUDA_ERROR_NOT_INITIALIZED, so a count that succeeds means it was started)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return True
    except Exception:
        pass
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return int(driver.cuDeviceGetCount(ctypes.byref(count))) == 0


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    done, failed = preimport(modules(dict(os.environ)))
    if cuda_initialized():  # it would hold GPU memory beside the launch being measured: not held
        print("# studyc-held: an import started CUDA; exiting (the server starts cold)", flush=True)
        return 3
    print(f"# studyc-held: {done} modules imported in {time.monotonic() - t0:.1f} s (skipped: {len(failed)}); "
          "waiting", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        return 0
    print(f"# studyc-held: go after {time.monotonic() - t0:.1f} s", flush=True)
    from vllm.entrypoints.cli.main import main as cli

    sys.argv = ["vllm", *argv]
    cli()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
