"""Write compiler/vllm_serve_options.json: every `vllm serve` option with the kind of value it takes.

Run with the engine's python (not studyc's), e.g.
    .venv-vllm/bin/python scripts/vllm_serve_options.py > compiler/vllm_serve_options.json
It reads vLLM's own argparse parser, so the compiler can type-check study engine options
without importing vLLM at validate time.

Kinds: bool (a flag: true/false), int, float, str, size (an int or a string like "256M"),
size_or_auto, json (a table or a JSON string), str_or_json, any (not checked).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from typing import Any

from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def _inner(func: Any) -> Any:
    """The type wrapped by vLLM's optional_type / parse_type closures."""
    for cell in getattr(func, "__closure__", None) or ():
        value = cell.cell_contents
        if callable(value):
            return _inner(value)
    return func


def kind_of(action: argparse.Action) -> tuple[str, bool]:
    """(kind, optional): optional means the string "None" is accepted too."""
    if isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "bool", False
    func = action.type
    if func is None:
        return "str", False
    optional = getattr(func, "__name__", "") == "_optional_type"
    inner = _inner(func)
    name = getattr(inner, "__name__", "")
    kinds = {
        "int": "int", "float": "float", "str": "str", "human_readable_int": "size",
        "human_readable_int_or_auto": "size_or_auto", "loads": "json", "parse_dataclass": "json",
        "union_dict_and_str": "str_or_json",
    }
    return kinds.get(name, "any"), optional


def main() -> None:
    parser = make_arg_parser(FlexibleArgumentParser())
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        kind, optional = kind_of(action)
        entry: dict[str, Any] = {"kind": kind}
        if optional:
            entry["optional"] = True
        if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
            entry["list"] = True
        if action.choices is not None and kind != "bool":
            entry["choices"] = sorted(str(c) for c in action.choices)
        for flag in longs:
            options[flag[2:]] = entry
    doc = {
        "source": f"vllm serve argparse parser, vLLM {version('vllm')} "
        "(scripts/vllm_serve_options.py, run with the engine's python)",
        "options": dict(sorted(options.items())),
    }
    # One option per line, so a vLLM upgrade shows as a readable diff.
    lines = [f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}" for name, entry in doc["options"].items()]
    sys.stdout.write('{\n "source": ' + json.dumps(doc["source"]) + ',\n "options": {\n')
    sys.stdout.write(",\n".join(lines) + "\n }\n}\n")


if __name__ == "__main__":
    main()
