"""The step-time model's fits kept on disk between commands (`studyc plan --db`, `studyc model`,
`studyc site` fit the same keys on the same stored points again and again; one fit replays every point
many times). A fit is a pure function of its observations and of the model's code, so a file named by
the digest of both is its answer: new points, or a changed model, make a new digest and a new fit; no
file is ever stale. A file that cannot be read or parsed is a miss; one that cannot be written is
skipped (the fit is still returned).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from compiler import hardware, modelmath, stepcost, stepfit, stepreplay
from compiler.stepcost import Coefficients
from compiler.stepfit import Observation

# The modules whose code decides a fit's result.
FIT_CODE = (stepfit, stepreplay, stepcost, modelmath, hardware)


@functools.cache
def code_digest() -> str:
    """The digest of the model's code: a change to any module a fit runs invalidates every fit."""
    h = hashlib.sha256()
    for module in FIT_CODE:
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def fit_digest(label: str, observations: Sequence[Observation]) -> str:
    """The name of a fit: the model's code, the key's label and every observation, in order."""
    h = hashlib.sha256(code_digest().encode())
    h.update(label.encode())
    for o in observations:
        h.update(repr(o).encode())
    return h.hexdigest()


class FitCache:
    """Fits in `folder` (None: kept nowhere), one JSON file each: the coefficients, or why it failed."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def get(self, digest: str) -> Coefficients | str | None:
        if self.folder is None:
            return None
        try:
            found = json.loads((self.folder / f"{digest}.json").read_text())
            if "failed" in found:
                return str(found["failed"])
            return Coefficients(**found["coefficients"])
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def put(self, digest: str, value: Coefficients | str) -> None:
        if self.folder is None:
            return
        body = {"failed": value} if isinstance(value, str) else {"coefficients": asdict(value)}
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder)  # beside its name: the rename is atomic
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f)
            os.replace(tmp, self.folder / f"{digest}.json")
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
