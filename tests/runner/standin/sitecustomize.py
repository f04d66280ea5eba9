"""A fault on demand for the start-retry tests, imported by the engine's interpreter at its start when this
folder is on its PYTHONPATH (an arm's `env`). With STUDYC_TEST_DIE_ONCE naming a file that does not exist
yet, vLLM's CLI `main` creates it and exits with code 2 the first time it runs: at `go` in a held start (the
held script imported the CLI long before), at once in a cold one. Every later start serves normally.
Everything else (the engine, its server, the runner) is real."""

import importlib.abc
import importlib.machinery
import os
import sys

_FLAG = os.environ.get("STUDYC_TEST_DIE_ONCE")
_CLI = "vllm.entrypoints.cli.main"


class _DieOnce(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != _CLI:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            run_module(module)
            real = module.main

            def main(*args, **kwargs):  # type: ignore[no-untyped-def]
                if _FLAG and not os.path.exists(_FLAG):
                    open(_FLAG, "w").close()
                    sys.stderr.write("stand-in fault: the engine exits before it is ready\n")
                    sys.stderr.flush()
                    os._exit(2)
                return real(*args, **kwargs)

            module.main = main

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _FLAG:
    sys.meta_path.insert(0, _DieOnce())
