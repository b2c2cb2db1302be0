"""TinyLoop replicas on Ray Serve (docs/scaling.md): one OpenAI-compatible endpoint in front
of N engine replicas, requests that share a prefix routed to the replica holding it.

    tinyloop serve MODEL --ray --replicas 2 --replica-threads 1
    serve run python/tinyloop/scale/serve_config.yaml          # a cluster

Files: routing.py (routing keys, rendezvous ranking, /metrics merging: plain Python),
router.py (the Ray Serve request router), bridge.py (an ASGI app called in-process as an
async generator), app.py (the ingress and engine deployments, build_app), serve.py (the
CLI's --ray mode), bench.py (1 vs N replicas under bench/server_load.py's load).
"""
__all__ = ["build_app"]


def __getattr__(name):  # lazy: importing tinyloop.scale must not start or import Ray
    if name == "build_app":
        from .app import build_app
        return build_app
    raise AttributeError(name)
