"""Line numbers for dotted TOML keys, so every study error can say `file:line: key: message`.

tomllib gives values without positions; this scanner maps each table header and `key =` line to
its dotted path (array-of-tables entries get their index). A path not found falls back to its
nearest recorded ancestor.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_INLINE_KEY = re.compile(r"""(?:^|[{,])\s*([A-Za-z0-9_-]+|"[^"]*")\s*=""")


def _split_key(key: str) -> list[str]:
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[A-Za-z0-9_-]+', key)
    return [p[1:-1] if p[0] in "\"'" else p for p in parts]


def _strip_strings(line: str) -> str:
    """The line without string contents and comments, for bracket counting."""
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', '""', line).split("#", 1)[0]


def key_lines(text: str) -> dict[str, int]:
    """Map dotted paths (`load.concurrency`, `hypothesis[1].predict`) to 1-based line numbers."""
    lines: dict[str, int] = {}
    table: list[str] = []
    counters: dict[str, int] = {}
    depth = 0  # open brackets of a multi-line value
    for number, line in enumerate(text.splitlines(), start=1):
        if depth > 0:
            clean = _strip_strings(line)
            depth += clean.count("[") + clean.count("{") - clean.count("]") - clean.count("}")
            continue
        header = _HEADER.match(line)
        if header:
            path = _split_key(header.group(2))
            if header.group(1) == "[[":
                base = ".".join(path)
                index = counters.get(base, -1) + 1
                counters[base] = index
                table = path[:-1] + [f"{path[-1]}[{index}]"]
            else:
                table = path
            lines.setdefault(_join(table), number)
            continue
        key = _KEY.match(line)
        if not key:
            continue
        path = table + _split_key(key.group(1))
        dotted = _join(path)
        lines.setdefault(dotted, number)
        rest = _strip_strings(line[key.end():])
        if rest.strip().startswith("{"):
            for inner in _INLINE_KEY.findall(rest):
                lines.setdefault(f"{dotted}.{inner.strip(chr(34))}", number)
        depth = rest.count("[") + rest.count("{") - rest.count("]") - rest.count("}")
        depth = max(depth, 0)
    return lines


def _join(parts: list[str]) -> str:
    out = ""
    for part in parts:
        if part.startswith("[") or not out:
            out += part
        else:
            out += "." + part
    return out


def line_of(lines: dict[str, int], path: str) -> int:
    """Line of `path` or of its nearest ancestor; 1 when nothing matches."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return 1


def dotted(loc: tuple[str | int, ...]) -> str:
    """Pydantic's error location as a dotted path: ('load', 'concurrency', 2) -> load.concurrency[2]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out
