"""HTTP to a local engine: one request at a time, never routed through a proxy from the environment."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

# Loopback only: never route a local engine through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_url(method: str, url: str, api_key: str | None, timeout_s: float) -> Any:
    """The open response of one request (a context manager); raises urllib's errors."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    return _OPENER.open(req, timeout=timeout_s)


def http_call(method: str, url: str, api_key: str | None = None, timeout_s: float = 10.0) -> tuple[int, str]:
    """(status, body) of one request; status 0 and the error text when nothing answered."""
    try:
        with open_url(method, url, api_key, timeout_s) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read().decode("utf-8", "replace")
        except OSError:
            body = ""
        return int(exc.code), body
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))
