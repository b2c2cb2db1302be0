"""`tinyloop serve MODEL --ray --replicas N [--replica-threads T]`: a local Ray instance on
127.0.0.1 (no dashboard), Serve's HTTP proxy on --host:--port, the application of app.py,
and a clean stop on Ctrl-C / SIGTERM (serve.shutdown(), then ray.shutdown()).

`--ray-address ADDR` deploys on a running cluster instead (`ray start --head` there; the
model path must exist on every node; docs/scaling.md). The single-machine server's flags
(--api-key, --model-name, --kv-budget-mb, --max-num-seqs, --max-queue, --max-body-bytes,
--timeout) apply to every replica.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

log = logging.getLogger("tinyloop.scale")


def add_arguments(p) -> None:
    """The --ray flags of `tinyloop serve` (tinyloop.server.serve.add_arguments calls this)."""
    g = p.add_argument_group("Ray Serve replicas (--ray; docs/scaling.md)")
    g.add_argument("--ray", action="store_true", help="serve N engine replicas behind Ray Serve's HTTP proxy")
    g.add_argument("--replicas", type=int, default=1, help="engine replicas (autoscaling: the initial count)")
    g.add_argument("--replica-threads", type=int, default=0,
                   help="kernel threads per replica (default: TINYLOOP_NUM_THREADS, else every core)")
    g.add_argument("--replica-cpus", type=float, default=None,
                   help="logical CPUs Ray reserves per replica (default: --replica-threads, or 1)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas (default 1)")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas (turns it on)")
    g.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscaling: requests per replica it aims for (default 8)")
    g.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="requests one replica takes at once; more wait in the router (default 64)")
    g.add_argument("--spill-at", type=int, default=None,
                   help="a key's replica holding this many requests sends new ones to the least-loaded (default 16)")
    g.add_argument("--route-chat", default="history", choices=["history", "conversation", "system", "none"],
                   help="chat routing key: system prompt + messages before the last user turn (history), "
                        "+ the first user turn (conversation), the system prompt (system), none")
    g.add_argument("--route-prefix-chars", type=int, default=None,
                   help="completions routing key: the prompt's first N characters (default 256)")
    g.add_argument("--route-prefix-tokens", type=int, default=None,
                   help="completions routing key for token-id prompts: the first N ids (default 64)")
    g.add_argument("--ray-address", default=None,
                   help="deploy on this running Ray cluster (e.g. auto) instead of starting a local one")


def app_options(args) -> dict:
    """build_app's options from the parsed `tinyloop serve` arguments."""
    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    opts = {"model": args.model, "model_name": get("model_name"), "replicas": get("replicas", 1),
            "replica_threads": get("replica_threads", 0), "replica_cpus": get("replica_cpus"),
            "min_replicas": get("min_replicas"), "max_replicas": get("max_replicas"),
            "target_ongoing_requests": get("target_ongoing_requests"),
            "max_ongoing_requests": get("max_ongoing_requests"), "spill_at": get("spill_at"),
            "route_chat": get("route_chat"), "route_prefix_chars": get("route_prefix_chars"),
            "route_prefix_tokens": get("route_prefix_tokens"), "api_key": get("api_key"),
            "timeout": get("timeout"), "max_body_bytes": get("max_body_bytes"),
            "kv_budget_mb": get("kv_budget_mb"), "max_num_seqs": get("max_num_seqs"), "max_queue": get("max_queue")}
    return {k: v for k, v in opts.items() if v is not None}


def _source_python_dir() -> str | None:
    """python/ of a source checkout when this tinyloop package is imported from there (Ray's
    worker processes must import the same one); None for an installed package."""
    import tinyloop

    parent = os.path.dirname(os.path.dirname(os.path.abspath(tinyloop.__file__)))
    return None if os.path.basename(parent) in ("site-packages", "dist-packages") else parent


def start_local_ray(num_cpus: int | None = None, host: str = "127.0.0.1", port: int = 8000,
                    quiet: bool = True) -> None:
    """A Ray instance of this machine only (every Ray process on 127.0.0.1, no dashboard, no
    usage reporting) and Serve's HTTP proxy on host:port."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray takes 127.0.0.1 for "this machine's reachable address" unless it is told that this
    # is no cluster (the switch Ray has for laptops): then the node's address is 127.0.0.1
    # and its gRPC servers, agents and workers listen there only.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    src = _source_python_dir()
    if src:  # raylet and workers inherit the environment of a local instance
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if src not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([src, *paths])
    import ray
    from ray import serve
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray.init resolves the node address
    ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, _node_ip_address="127.0.0.1",
             logging_level=logging.WARNING if quiet else logging.INFO, log_to_driver=not quiet,
             configure_logging=True)
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"} if quiet else None)


def deploy(opts: dict, blocking: bool = False):
    from ray import serve

    from .app import APP_NAME, build_app

    return serve.run(build_app(opts), name=APP_NAME, route_prefix="/", blocking=blocking)


def stop(timeout: float = 30.0) -> None:
    """serve.shutdown() (replicas drain, engines close), then ray.shutdown(). The first is
    given `timeout` seconds: it waits on Ray forever when Ray's own processes are already
    gone (a signal sent to the whole process group reaches the raylet too)."""
    import ray
    from ray import serve

    t = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        print(f"tinyloop serve --ray: Serve did not shut down within {timeout:.0f} s; stopping Ray",
              file=sys.stderr, flush=True)
    ray.shutdown()


def run(args) -> int:
    opts = app_options(args)
    if opts.get("model") is None:
        print("tinyloop serve --ray: no model (pass MODEL or set TINYLOOP_MODEL)", file=sys.stderr)
        return 2
    replicas = opts.get("max_replicas") or opts.get("replicas", 1)
    per = opts.get("replica_cpus") or opts.get("replica_threads") or 1
    cores = os.cpu_count() or 1
    need = int(replicas * per + 0.999)
    if getattr(args, "ray_address", None):
        import ray
        from ray import serve

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
        serve.start(http_options={"host": args.host, "port": args.port})
    else:
        if need > cores:
            print(f"tinyloop serve --ray: {replicas} replicas x {per} CPUs on {cores} cores: the replicas "
                  f"share them (Ray is told {need} CPUs)", file=sys.stderr, flush=True)
        start_local_ray(num_cpus=max(cores, need), host=args.host, port=args.port,
                        quiet=args.log_level not in ("info", "debug"))
    stop_event = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_event.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deploy(opts)
        print(f"tinyloop serve --ray: {opts['model']} on http://{args.host}:{args.port} "
              f"({opts.get('replicas', 1)} replica(s)"
              + (f", autoscaling {opts.get('min_replicas', 1)}..{opts['max_replicas']}" if opts.get("max_replicas")
                 else "") + f", {opts.get('replica_threads') or 'default'} thread(s) each); Ctrl-C stops",
              file=sys.stderr, flush=True)
        while not stop_event.wait(1.0):
            pass
        print("tinyloop serve --ray: stopping", file=sys.stderr, flush=True)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        stop()
    print("tinyloop serve --ray: stopped", file=sys.stderr, flush=True)
    return 0
