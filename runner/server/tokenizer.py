#!/usr/bin/env python3
"""Build a synthetic tokenizer for a weight-less model folder, offline and deterministically.

usage: python -m runner.server.tokenizer MODEL_DIR [MODEL_DIR ...]   (the runner also calls `ensure_tokenizer`)

Reads MODEL_DIR/config.json (and generation_config.json when present) and writes
tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast) at exactly the config's vocab_size,
so that `vllm serve MODEL_DIR --load-format dummy` needs nothing from the hub.

Design: a WordLevel vocabulary where id i is the word "w<i>", except the special tokens, which sit
at the ids the configs name (bos/eos/pad, under the model family's real names where known) and an
"<unk>" at the highest free id. A Whitespace pre-tokenizer makes one word one token, so
decode(ids) = "w12 w345 ..." re-encodes to exactly the same ids (token-exact prompt lengths).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

# The real names of special ids, by model family (model_type prefix).
_KNOWN_SPECIALS: dict[str, dict[int, str]] = {
    "qwen": {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"},
    "deepseek": {100000: "<｜begin▁of▁sentence｜>", 100001: "<｜end▁of▁sentence｜>"},
}
_ROLE_NAMES = {"eos": "<eos>", "bos": "<bos>", "pad": "<pad>"}
UNK = "<unk>"


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a JSON object")
    return data


def special_tokens(
    config: dict[str, Any], generation: dict[str, Any]
) -> tuple[dict[int, str], dict[str, str]]:
    """Special id -> name, and role (bos/eos/pad/unk) -> name. generation_config wins for roles."""
    vocab_size = int(config["vocab_size"])
    family = next((k for k in _KNOWN_SPECIALS if str(config.get("model_type", "")).startswith(k)), "")
    known = {i: n for i, n in _KNOWN_SPECIALS.get(family, {}).items() if i < vocab_size}
    role_ids = {role: _ids(generation.get(f"{role}_token_id")) or _ids(config.get(f"{role}_token_id"))
                for role in ("eos", "bos", "pad")}
    specials = dict(known)
    for role in ("eos", "bos", "pad"):  # eos first: it names an id shared with pad
        for i in role_ids[role]:
            if not 0 <= i < vocab_size:
                raise SystemExit(f"{role}_token_id {i} is outside the vocabulary (size {vocab_size})")
            specials.setdefault(i, _ROLE_NAMES[role])
    unk_id = max(i for i in range(vocab_size) if i not in specials)
    specials[unk_id] = UNK
    roles = {role: specials[ids[0]] for role, ids in role_ids.items() if ids}
    roles["unk"] = UNK
    roles.setdefault("pad", roles.get("eos", UNK))
    return dict(sorted(specials.items())), roles


def chat_template(specials: dict[int, str], roles: dict[str, str]) -> str:
    """A minimal template so /v1/chat/completions works; ChatML where the model has its tokens."""
    names = set(specials.values())
    if {"<|im_start|>", "<|im_end|>"} <= names:
        return ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    return ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} " + roles.get("eos", UNK) + " "
            "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}")


def build(model_dir: Path) -> Tokenizer:
    config = _read_json(model_dir / "config.json")
    if "vocab_size" not in config:
        raise SystemExit(f"{model_dir / 'config.json'}: missing or without vocab_size")
    generation = _read_json(model_dir / "generation_config.json")
    vocab_size = int(config["vocab_size"])
    specials, roles = special_tokens(config, generation)
    vocab = {specials.get(i, f"w{i}"): i for i in range(vocab_size)}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials.values()])
    check_round_trip(tok, vocab_size)
    # Each file is written beside its name and renamed into place: two processes building at once (two test
    # workers) never let a third read half a file.
    partial = model_dir / f".tokenizer.json.{os.getpid()}"
    tok.save(str(partial), pretty=False)
    os.replace(partial, model_dir / "tokenizer.json")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": roles.get("bos"),
        "eos_token": roles.get("eos"),
        "pad_token": roles["pad"],
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(config.get("max_position_embeddings", 2048)),
        "chat_template": chat_template(specials, roles),
    }
    text = json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n"
    partial = model_dir / f".tokenizer_config.json.{os.getpid()}"
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, model_dir / "tokenizer_config.json")
    return tok


def check_round_trip(tok: Tokenizer, vocab_size: int) -> None:
    """Every id, specials included, decodes to text that encodes back to the same id sequence."""
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, not {vocab_size}")
    ids = list(range(vocab_size))
    back = tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids
    if back != ids:
        diffs = (i for i, (a, b) in enumerate(zip(ids, back, strict=False)) if a != b)
        first = next(diffs, min(len(ids), len(back)))
        raise SystemExit(f"round trip failed at position {first}")


def ensure_tokenizer(model_dir: str | Path) -> bool:
    """Build the model folder's tokenizer unless it is there already; True when it was built.

    The tokenizer files are not committed (several MB each): every run builds them locally.
    """
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file() and (model_dir / "tokenizer_config.json").is_file():
        return False
    build(model_dir)
    return True


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        model_dir = Path(arg)
        tok = build(model_dir)
        print(f"{model_dir}: {tok.get_vocab_size(with_added_tokens=True)} ids, "
              f"{(model_dir / 'tokenizer.json').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
