"""`tinyloop serve MODEL`: the engine plus uvicorn, and the drain on Ctrl-C / SIGTERM.

Drain: the first SIGINT / SIGTERM marks the server draining: /health answers 503, new API
requests get 503, the requests in flight (streams included) go on. Once none is left,
uvicorn's own shutdown runs (listening socket closed, idle connections closed), then the
engine closes with drain=True and the process exits 0. A second signal stops at once
(uvicorn's force exit: in-flight streams are cut).

uvicorn re-raises a captured signal after its shutdown so the default handler runs, which
would end the process "killed by SIGTERM" instead of exit 0; this server takes the signal
over instead (handle_exit), since a drained shutdown is a normal exit.
"""
from __future__ import annotations

import logging
import signal
import sys
import time

log = logging.getLogger("tinyloop.server")


def _server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self, config, state, drain_timeout: float):
            super().__init__(config)
            self.state = state
            self.drain_timeout = drain_timeout
            self.drain_started = None

        def handle_exit(self, sig, frame):  # called from the signal handler
            if self.state.draining:  # second signal: stop now
                self.should_exit = True
                self.force_exit = True
                return
            self.state.draining = True
            self.drain_started = time.monotonic()
            print(f"tinyloop serve: {signal.Signals(sig).name}: draining "
                  f"({self.state.counters.in_flight} requests in flight; again to stop at once)",
                  file=sys.stderr, flush=True)

        async def on_tick(self, counter):
            if self.state.draining and not self.should_exit:
                late = self.drain_timeout > 0 and time.monotonic() - self.drain_started > self.drain_timeout
                if self.state.counters.in_flight == 0 or late:
                    self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer


def run(args) -> int:
    if getattr(args, "ray", False):  # N replicas behind Ray Serve (docs/scaling.md)
        from ..scale.serve import run as run_ray
        return run_ray(args)
    import uvicorn

    from .app import create_app
    from .state import EngineState

    engine_kwargs = {k: v for k, v in (("kv_budget_mb", args.kv_budget_mb), ("max_num_seqs", args.max_num_seqs),
                                       ("max_queue", args.max_queue)) if v is not None}
    state = EngineState(args.model, model_name=args.model_name, timeout=args.timeout or 0.0, **engine_kwargs)
    app = create_app(state, api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="off",
                            access_log=args.log_level == "debug", timeout_graceful_shutdown=args.drain_timeout or None)
    server = _server_class()(config, state, args.drain_timeout)
    print(f"tinyloop serve: {state.model_name} ({args.model}, max_seq_len {state.max_seq_len}, "
          f"{'chat template' if state.template else 'no chat template: plain transcript'}) on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        server.run()
    finally:
        state.close(drain=True)  # nothing is in flight after a drain; a forced exit cancels
    if not server.started:
        return 1  # e.g. the port was taken (uvicorn logged why)
    print("tinyloop serve: stopped", file=sys.stderr, flush=True)
    return 0


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help="a .tinyloop file (default: the bundled model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on the API routes")
    p.add_argument("--model-name", default=None, help="the model's name in the API (default: the file's stem)")
    p.add_argument("--max-queue", type=int, default=None, help="waiting requests before 429 (engine default 4096)")
    p.add_argument("--kv-budget-mb", type=float, default=None, help="KV pool size (engine default 1024)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="requests running at once (engine default 64)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413 (default 1 MiB)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds per request from arrival (0: none); past it: 408, or a stream's "
                        "last chunk has finish_reason 'timeout'")
    p.add_argument("--drain-timeout", type=float, default=0.0,
                   help="on SIGTERM wait at most this long for in-flight requests (0: as long as they take)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    from ..scale.serve import add_arguments as ray_arguments  # --ray, --replicas, ... (no Ray import)
    ray_arguments(p)
