"""Run a snippet in a child Python so that a crash (segfault, abort), a hang or a memory
blow-up fails the test that asked instead of killing pytest (issue 16: every crash
regression runs this way)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

_PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB, from Linux's VmHWM. Not getrusage's ru_maxrss:
    that survives exec, so a child forked from a big pytest process (models loaded, torch
    imported) starts with the parent's peak and an RSS bound on the child could not fail or
    would fail for nothing."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@dataclass
class ChildResult:
    rc: int
    out: str
    err: str

    def describe(self) -> str:
        how = f"killed by signal {-self.rc}" if self.rc < 0 else f"exit {self.rc}"
        return f"child {how}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def run_child(code: str, timeout: float = 60, mem_limit_bytes: int | None = None,
              args: list[str] | None = None) -> ChildResult:
    """Runs `code` (dedented) with this checkout's python/ and tests/ importable. A hang
    past `timeout` seconds is an AssertionError; mem_limit_bytes caps the child's address
    space (RLIMIT_AS), so a blow-up ends in MemoryError there, not in the machine swapping."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (os.environ.get("PYTHONPATH"), _PYTHON_DIR, _TESTS_DIR) if p])
    env["PYTHONFAULTHANDLER"] = "1"

    def limit():  # in the child, before exec
        if mem_limit_bytes is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit_bytes, mem_limit_bytes))

    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + (args or []),
                           capture_output=True, text=True, timeout=timeout, env=env,
                           preexec_fn=limit if mem_limit_bytes is not None else None)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"child hung: no exit within {timeout} s\n--- stderr\n"
                             f"{(e.stderr or b'')[-3000:]!r}") from None
    return ChildResult(p.returncode, p.stdout, p.stderr)


def expect_clean_exit(code: str, **kw) -> ChildResult:
    """run_child, asserting the child exited 0 (so it neither crashed nor failed an assert)."""
    r = run_child(code, **kw)
    assert r.rc == 0, r.describe()
    return r
