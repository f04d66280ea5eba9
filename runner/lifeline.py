"""Child processes that die with their parent. A SIGKILLed studyc (a CI job's timeout, the OOM killer) runs no
cleanup of its own, so each child studyc starts for work of its own (the load generator's workers, the step-time
model's fits) asks the kernel to kill it as soon as its parent is gone (Linux `PR_SET_PDEATHSIG`). The vLLM
servers are not among them: they run in sessions of their own, and the reaper (`runner.execute.reaper`) stops
them, after their own clean shutdown."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int | None = None) -> bool:
    """Called in a child: SIGKILL it when its parent exits. With `parent` (the pid the parent had), a child
    whose parent is already gone exits at once (the parent died before the request took effect). False
    where the platform cannot (not Linux): the child then outlives a killed parent."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(1)
    return True
