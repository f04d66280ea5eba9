"""A `vllm serve` start held after its imports, run by the engine's own interpreter:

    PYTHON held.py ARGV...

It imports vLLM's CLI and the modules a start imports later (the API server, the engine core, the
worker, the model's class, torch.compile), prints one `# studyc-held:` line, then waits for a line on
standard input: `go` runs the CLI as `vllm ARGV...`; anything else, or the end of the input, exits.
So the imports of the next launch's server (the API process's, and the engine core's where vLLM forks
it from this process, which then inherits them) run while the current launch starts, and the start
itself begins at `go`. Nothing here should touch a GPU: if an import started CUDA anyway, the line says
so and vLLM is told to spawn its engine core (a forked child cannot use CUDA its parent started).

Standard library only, since it runs in the engine's environment, not studyc's.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import time

# In the order a start imports them; a module missing from this vLLM version is skipped.
MODULES = (
    "torch",
    "transformers",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.abstract",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.compilation.backends",
    "vllm.compilation.decorators",
    "torch._dynamo",
    "torch._inductor.compile_fx",
)


def model_modules(argv: list[str]) -> list[str]:
    """vLLM's modules for the served model's architectures (config.json of `serve MODEL_DIR`)."""
    if len(argv) < 2 or argv[0] != "serve":
        return []
    try:
        with open(f"{argv[1]}/config.json") as fh:
            archs = json.load(fh).get("architectures") or []
        from vllm.model_executor.models.registry import _VLLM_MODELS
    except Exception:
        return []
    return [f"vllm.model_executor.models.{_VLLM_MODELS[a][0]}" for a in archs if a in _VLLM_MODELS]


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
    done, failed = preimport([*MODULES, *model_modules(argv)])
    started = cuda_initialized()
    if started:  # a forked engine core could not use CUDA: let vLLM spawn it (it imports again)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    print(f"# studyc-held: {done} modules imported in {time.monotonic() - t0:.1f} s "
          f"(skipped: {len(failed)}); CUDA initialised: {'yes: engine core spawned' if started else 'no'}; "
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
