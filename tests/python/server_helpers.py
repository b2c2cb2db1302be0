"""Servers for the server tests: `tinyloop serve`'s app in a thread of the test process
(uvicorn on a free 127.0.0.1 port), or the real command in a subprocess."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, url, state, server):
        self.url = url            # http://127.0.0.1:PORT
        self.base = url + "/v1"   # the openai client's base_url
        self.state = state        # the EngineState (engine stats, counters)
        self.server = server


@contextlib.contextmanager
def server_in_thread(model=BUNDLED, api_key=None, max_body_bytes=1 << 20, timeout=0.0, **engine_kwargs):
    import uvicorn

    from tinyloop.server import EngineState, create_app

    engine_kwargs.setdefault("kv_budget_mb", 64)
    state = EngineState(model, timeout=timeout, **engine_kwargs)
    app = create_app(state, api_key=api_key, max_body_bytes=max_body_bytes)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", state, server)
    finally:
        server.should_exit = True
        thread.join(30)
        state.close()


def wait_until(cond, timeout=10.0, step=0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


@contextlib.contextmanager
def serve_subprocess(*args, model=BUNDLED, timeout=60):
    """`tinyloop serve MODEL --port N ARGS...` from this checkout; yields (process, url)."""
    import httpx

    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "tinyloop.cli", "serve", model, "--host", "127.0.0.1",
                             "--port", str(port), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tinyloop serve exited {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tinyloop serve did not answer /health")
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
