"""`studyc new`: the text of a commented starter study that runs on the machine at hand.

On a host without a GPU it serves the repository's tiny model with the CPU engine settings (the CPU
build of vLLM must be told its KV size); on a GPU host, an 8B shape against that GPU's spec sheet.
`--from STUDY` starts from an existing study instead, with its id and relative paths rewritten.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from base.errors import StudycError
from compiler.study import SLUG

MODELS = Path(__file__).resolve().parents[1] / "models"

_CPU = '''\
# {name}: a study of a tiny dummy-weight model on the CPU build of vLLM.
# Check it with `studyc validate {file}`, read its plan with `studyc plan {file}`,
# run it with `studyc run {file}`, score it with `studyc audit {file}`.
[study]
id = "{name}"                       # prefixes every point id: {name}/base/short/c1/r1
title = "{name}: batching on a tiny model"
question = "How much does batching raise output throughput on this machine?"
hardware = "cpu"                    # no spec sheet: predictions use the bandwidth measured at run start

[model]
path = "{model}"                    # a folder with config.json; weights are random (load_format = "dummy")
name = "tiny-qwen3"

[engine]                            # `vllm serve` options for every arm, named like the CLI options
max_model_len = 2048
max_num_seqs = 16
kv_cache_memory_bytes = "256M"      # the CPU engine needs its KV size (else it takes 92% of RAM)
block_size = 32                     # CPU attention wants block sizes in multiples of 32
enforce_eager = true                # skips torch.compile: a 20 s start instead of 80 s
distributed_executor_backend = "uni"

[env]
VLLM_ENABLE_V1_MULTIPROCESSING = "0"   # one engine process

[arms.base]                         # launches of its own server; add arms that change one option
description = "The engine settings above"

[workloads.short]                   # token-exact requests: token-id prompts, ignore_eos + max_tokens
input_len = 128
output_len = 32

[load]
concurrency = [1, 4]                # closed loop: requests in flight, one point per level
requests = 16                       # more than the highest concurrency: a steady state, not one wave
warmup = 2
repeats = 1                         # interleaved inside each launch
launches = 3                        # server instances per arm: the interval is taken between them, so it takes
                                    # 2 or more to decide (one reads "inconclusive (one launch)"); 3-5 on a GPU
cache = "reset"                     # prefix cache reset (and verified) before every point

[[hypothesis]]
id = "batching-helps"
claim = "Four requests in flight give more than twice the output throughput of one"
metric = "output_throughput"        # `studyc metrics` lists them all
where = {{ arm = "base" }}
predict = {{ ratio = [{{ concurrency = 4 }}, {{ concurrency = 1 }}], relation = ">", value = 2.0 }}
'''

_GPU = '''\
# {name}: a study of an 8B model shape on {gpu}.
# Check it with `studyc validate {file}`, read its plan with `studyc plan {file}`,
# run it with `studyc run {file}`, score it with `studyc audit {file}`.
[study]
id = "{name}"                       # prefixes every point id: {name}/base/decode/c1/r1
title = "{name}: batch-1 decode against the bandwidth roofline"
question = "What fraction of the weight-streaming ceiling does batch-1 decode reach?"
hardware = "{hardware}"             # spec sheet scored beside the bandwidth measured at run start

[model]
path = "{model}"                    # config.json only: dummy weights, same shapes, same speed
name = "Qwen/Qwen3-8B"

[engine]                            # `vllm serve` options for every arm, named like the CLI options
max_model_len = 4096

[arms.base]                         # one server per arm; add arms that change one option
description = "vLLM defaults"

[workloads.decode]                  # token-exact requests: token-id prompts, ignore_eos + max_tokens
input_len = 128
output_len = 256

[load]
concurrency = [1, 8]                # closed loop: requests in flight, one point per level
requests = [8, 32]                  # more than the concurrency: a steady state, not one wave
warmup = 4
repeats = 3                         # per launch, interleaved
# launches = 5 (the default): server instances per arm, in randomised blocks, so the interval
# includes launch-to-launch variation; each launch costs a server start (about 2 minutes)
cache = "reset"                     # prefix cache reset (and verified) before every point

[[hypothesis]]
id = "batch1-roofline"
claim = "Batch-1 decode reaches about 80% of the measured weight-streaming ceiling"
metric = "output_throughput"        # `studyc metrics` lists them all
where = {{ concurrency = 1 }}
predict = {{ value = "0.80 * roofline.decode_tokens_per_s(batch=1, context=256)", tolerance = 0.10 }}
'''


def default_path(name: str) -> Path:
    return Path("studies") / f"{name.replace('-', '_')}.toml"


def check_name(name: str) -> None:
    if not re.match(SLUG, name):
        raise StudycError(f"study name {name!r} must be a slug: lowercase letters, digits, '-' or '_'")


def template(name: str, out: Path, hardware: str | None) -> str:
    """A starter study for `out`; `hardware` is this host's hardware table key, None without a GPU."""
    check_name(name)
    if hardware is None or hardware == "cpu":
        return _CPU.format(name=name, file=out, model=_rel(MODELS / "tiny-qwen3", out))
    return _GPU.format(name=name, file=out, model=_rel(MODELS / "qwen3-8b", out), hardware=hardware, gpu=hardware)


_PATH_LINE = re.compile(r'^(\s*(?:path|model|tokenizer)\s*=\s*")([^"]+)(".*)$')
_ID_LINE = re.compile(r'^(\s*id\s*=\s*")([^"]+)(".*)$')


def from_study(name: str, source: Path, out: Path) -> str:
    """`source`'s text with `study.id` set to `name` and relative folders re-aimed from `out`'s folder."""
    check_name(name)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise StudycError(f"{source}: cannot read: {exc.strerror}") from None
    lines: list[str] = []
    table = ""
    for line in text.splitlines():
        header = re.match(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            table = header.group(1)
        id_match = _ID_LINE.match(line)
        path_match = _PATH_LINE.match(line)
        if table == "study" and id_match:
            line = f"{id_match.group(1)}{name}{id_match.group(3)}"
        elif path_match and not os.path.isabs(path_match.group(2)):
            target = (source.parent / path_match.group(2)).resolve()
            line = f"{path_match.group(1)}{_rel(target, out)}{path_match.group(3)}"
        lines.append(line)
    return f"# Started from {source} by `studyc new {name} --from {source}`.\n" + "\n".join(lines) + "\n"


def _rel(target: Path, out: Path) -> str:
    return os.path.relpath(target, Path(os.path.abspath(out)).parent)
