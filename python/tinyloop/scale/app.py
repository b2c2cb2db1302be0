"""The Ray Serve application: an ingress deployment in front of N engine replicas.

    TinyLoopIngress (FastAPI, no CPU reserved)   --DeploymentHandle, PrefixAffinityRouter-->
    TinyLoopEngine  x N (one tl.Engine each, serving tinyloop.server's own create_app())

Ingress: reads the body, computes the routing key (routing.py), forwards the raw request
(method, path, headers, body) to an engine replica as a streaming handle call and relays
what comes back: the status and headers first, then the body chunks. It answers the
client only once the replica's first body chunk is there, so a replica that dies before
that is invisible to the client: the request is sent once more, to another replica. A
replica that dies after it ends the response with a retryable error (docs/scaling.md):
an SSE stream gets a last event `data: {"error": {..., "type": "replica_failed",
"code": "replica_failed"}}` then `data: [DONE]`; a request failing twice before its first
chunk gets HTTP 503 with that error object. The client going away cancels the handle call;
on the replica that ends in `http.disconnect` for the app (bridge.py), which cancels the
engine requests.

/metrics at the ingress: every live replica's own /metrics text (asked by pinning a call to
each), each sample labelled replica="<id>", plus the ingress's counters (tinyloop_ray_*).

Engine replica: tinyloop.server's EngineState + create_app() in the replica process, called
through bridge.call_asgi, so endpoints, errors and streams are exactly `tinyloop serve`'s.
Every response carries `x-tinyloop-replica: <id>`. check_health() fails when the engine is
closed or broken (its stats() raises), and Serve replaces the replica.

build_app(args) is also the `serve run` entry point (import_path tinyloop.scale.app:build_app).
"""
import asyncio
import logging
import os
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.exceptions import ReplicaUnavailableError

from .bridge import call_asgi
from .routing import KeyConfig, decisions, live, merge_metrics, routing_key

log = logging.getLogger("tinyloop.scale")

APP_NAME = "tinyloop"
ENGINE_DEPLOYMENT = "TinyLoopEngine"
INGRESS_DEPLOYMENT = "TinyLoopIngress"
REPLICA_HEADER = b"x-tinyloop-replica"
FAULT_HEADER = b"x-tinyloop-fault"
DEFAULT_MAX_BODY_BYTES = 1 << 20
METRICS_TIMEOUT_S = 10.0
REPLICA_ERRORS = (RayActorError, ReplicaUnavailableError)  # the replica process is gone
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
              b"proxy-authenticate", b"proxy-authorization"}


def replica_failed_error(message: str) -> dict:
    return {"error": {"message": message, "type": "replica_failed", "param": None, "code": "replica_failed"}}


# ---------------------------------------------------------------------------- engine replica

@serve.deployment(name=ENGINE_DEPLOYMENT)
class TinyLoopEngine:
    def __init__(self, model: str, model_name: str | None = None, threads: int = 0, timeout: float = 0.0,
                 api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 engine_kwargs: dict | None = None, fault_injection: bool = False):
        import tinyloop_py as tl

        from ..server import EngineState, create_app

        if threads and threads > 0:
            # The kernels' pool is process-wide (tl.set_num_threads); the env var is its
            # default, set too so that nothing resizing it "to the default" undoes this.
            os.environ["TINYLOOP_NUM_THREADS"] = str(int(threads))
            tl.set_num_threads(int(threads))
        self.threads = tl.get_num_threads()
        self.state = EngineState(model, model_name=model_name, timeout=timeout, **(engine_kwargs or {}))
        self.app = create_app(self.state, api_key=api_key, max_body_bytes=max_body_bytes)
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (tests calling the class directly)
            self.replica_id = f"local-{os.getpid()}"
        self.pid = os.getpid()
        self.fault_injection = bool(fault_injection)
        self._closed = threading.Event()

    def _inject_fault(self, request: dict) -> None:
        """Tests only (fault_injection=True): `x-tinyloop-fault: exit-once:PATH` ends this
        replica's process before it answers, unless PATH exists (the first replica to
        create it dies; the retry elsewhere finds it and serves)."""
        for k, v in request.get("headers") or ():
            if bytes(k).lower() == FAULT_HEADER and bytes(v).startswith(b"exit-once:"):
                try:
                    os.close(os.open(bytes(v)[len(b"exit-once:"):].decode(), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os._exit(17)

    async def forward(self, route: dict, request: dict):
        """One HTTP request through the app: {"status", "headers"} first, then body bytes."""
        if self.fault_injection:
            self._inject_fault(request)
        async for chunk in call_asgi(self.app, request, [(REPLICA_HEADER, self.replica_id.encode())]):
            yield chunk

    def metrics(self, route: dict | None = None) -> tuple[str, str]:
        from ..server import metrics

        text = metrics.render(self.state)
        text += ("# HELP tinyloop_replica_info this replica's process and kernel threads\n"
                 "# TYPE tinyloop_replica_info gauge\n"
                 f'tinyloop_replica_info{{pid="{self.pid}",threads="{self.threads}"}} 1\n')
        return self.replica_id, text

    def check_health(self) -> None:
        if self._closed.is_set():
            raise RuntimeError("the engine was closed")
        self.state.engine.stats()  # raises once the engine is closed or broken

    def __del__(self):
        closed = getattr(self, "_closed", None)
        if closed is not None and not closed.is_set():
            closed.set()
            self.state.close(drain=False)


# ---------------------------------------------------------------------------- ingress

ingress_app = FastAPI(title="TinyLoop on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0})
@serve.ingress(ingress_app)
class TinyLoopIngress:
    def __init__(self, engine, keys: dict | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.engine = engine
        self.keys = KeyConfig(**(keys or {}))
        self.max_body_bytes = int(max_body_bytes)
        self.retries = 0            # requests sent again after their replica failed before answering
        self.failed = 0             # requests answered 503 replica_failed (failed twice)
        self.cut = 0                # responses cut by their replica's failure after they began

    # -------------------------------------------------------------- /metrics

    async def _replica_metrics(self) -> dict[str, str]:
        async def one(route):
            return await self.engine.options(stream=False).metrics.remote(route)

        ids = live(ENGINE_DEPLOYMENT)
        if not ids:  # the router starts with the handle's first call: make one, then ask them all
            try:
                rid, text = await asyncio.wait_for(one({"key": None}), METRICS_TIMEOUT_S)
            except (asyncio.TimeoutError, *REPLICA_ERRORS):
                return {}
            for _ in range(40):
                ids = live(ENGINE_DEPLOYMENT)
                if ids:
                    break
                await asyncio.sleep(0.05)
            else:
                return {rid: text}
        # One replica after the other, not gathered: every handle call made while serving one
        # HTTP request carries that request's internal id, and Serve's router matches a routed
        # replica to its pending request by that id, so concurrent pinned calls would get
        # each other's replicas (Ray 2.60).
        out = {}
        for rid in ids:
            try:
                got, text = await asyncio.wait_for(one({"pin": rid}), METRICS_TIMEOUT_S)
            except (asyncio.TimeoutError, *REPLICA_ERRORS) as e:
                log.warning("metrics of replica %s: %s: %s", rid, type(e).__name__, e)
                continue
            out[got] = text
        return out

    @ingress_app.get("/metrics")
    async def metrics(self):
        texts = await self._replica_metrics()
        lines = [merge_metrics(texts).rstrip("\n")] if texts else []
        lines += ["# HELP tinyloop_ray_replicas engine replicas answering /metrics",
                  "# TYPE tinyloop_ray_replicas gauge", f"tinyloop_ray_replicas {len(texts)}",
                  "# HELP tinyloop_ray_retries_total requests sent again after their replica failed before answering",
                  "# TYPE tinyloop_ray_retries_total counter", f"tinyloop_ray_retries_total {self.retries}",
                  "# HELP tinyloop_ray_replica_failed_total requests answered 503 replica_failed",
                  "# TYPE tinyloop_ray_replica_failed_total counter",
                  f"tinyloop_ray_replica_failed_total {self.failed}",
                  "# HELP tinyloop_ray_responses_cut_total responses ended early by their replica's failure",
                  "# TYPE tinyloop_ray_responses_cut_total counter", f"tinyloop_ray_responses_cut_total {self.cut}",
                  "# HELP tinyloop_ray_route_decisions_total routing decisions (affinity: the key's replica "
                  "first; spill: it was over --spill-at; least_loaded: no key; pinned: /metrics)",
                  "# TYPE tinyloop_ray_route_decisions_total counter"]
        for (decision, replica), n in sorted(decisions().items()):
            lab = f'decision="{decision}"' + (f',replica="{replica}"' if replica else "")
            lines.append(f"tinyloop_ray_route_decisions_total{{{lab}}} {n}")
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")

    # -------------------------------------------------------------- everything else

    @ingress_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def forward(self, request: Request, path: str = ""):
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            return JSONResponse({"error": {"message": f"the request body is {declared} bytes, more than the "
                                           f"server's limit of {self.max_body_bytes} (--max-body-bytes)",
                                           "type": "invalid_request_error", "param": None,
                                           "code": "request_too_large"}}, status_code=413)
        body = await request.body()
        key = routing_key(request.url.path, body, self.keys)
        client = request.client
        req = {"method": request.method, "path": request.url.path,
               "query_string": request.url.query.encode("latin-1"),
               "headers": [(k, v) for k, v in request.headers.raw], "body": body,
               "client": [client.host, client.port] if client else None}
        route = {"key": key}
        for attempt in range(2):
            gen = self.engine.options(stream=True).forward.remote(route, req)
            done = False
            try:
                start = await gen.__anext__()
                try:
                    first = await gen.__anext__()
                except StopAsyncIteration:
                    first, done = b"", True
            except REPLICA_ERRORS as e:
                gen.cancel()
                failed = route.get("replica")
                if failed is None:
                    await asyncio.sleep(0.05)  # the router writes it back from its own loop
                    failed = route.get("replica")
                log.warning("replica %s failed before answering (%s: %s)%s", failed or "?", type(e).__name__, e,
                            "; sending the request to another replica" if attempt == 0 else "")
                if attempt == 0:
                    self.retries += 1
                    route = {"key": key, "avoid": [failed] if failed else []}
                    continue
                self.failed += 1
                return JSONResponse(replica_failed_error(
                    f"the engine replica serving this request failed ({type(e).__name__}), twice: retry it"),
                    status_code=503, headers={"retry-after": "1"})
            except BaseException:
                gen.cancel()
                raise
            break
        headers = {}
        raw = [(k, v) for k, v in start["headers"] if k.lower() not in HOP_BY_HOP]
        sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in raw)
        resp = StreamingResponse(self._relay(gen, first, done, sse), status_code=start["status"], headers=headers)
        resp.raw_headers = raw  # as the replica sent them (content-length included)
        return resp

    async def _relay(self, gen, first: bytes, done: bool, sse: bool):
        finished = done
        try:
            if first:
                yield first
            if not done:
                async for chunk in gen:
                    yield chunk
            finished = True
        except REPLICA_ERRORS as e:
            self.cut += 1
            log.warning("replica failed mid-response (%s: %s)", type(e).__name__, e)
            if sse:
                import json

                err = replica_failed_error(f"the engine replica serving this stream failed ({type(e).__name__}); "
                                           f"the output so far is incomplete: retry the request")
                yield b"data: " + json.dumps(err).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:  # the client went away: cancel the replica's side (its app sees a disconnect)
                gen.cancel()


# ---------------------------------------------------------------------------- the application

def _int(v, default=None):
    return default if v is None else int(v)


def build_app(args: dict):
    """The application, from plain options (a `serve run` config's `args`, or the CLI's):

    model (required), model_name, replicas (default 1), replica_threads (0: the default:
    TINYLOOP_NUM_THREADS, else every core), replica_cpus (logical CPUs Ray reserves per
    replica; default replica_threads or 1), min_replicas / max_replicas /
    target_ongoing_requests (autoscaling: on when max_replicas is set),
    max_ongoing_requests (per replica, default 64), spill_at (default 16), route_chat
    (history | conversation | system | none), route_prefix_chars, route_prefix_tokens,
    api_key, timeout, max_body_bytes, kv_budget_mb, max_num_seqs, max_queue,
    health_check_period_s, health_check_timeout_s, graceful_shutdown_timeout_s;
    fault_injection (tests only: see TinyLoopEngine._inject_fault).
    """
    from .router import DEFAULT_SPILL_AT, PrefixAffinityRouter

    args = dict(args or {})
    model = args.get("model")
    if not model:
        raise ValueError("build_app needs a model (a .tinyloop path readable on every node)")
    model = os.path.abspath(os.path.expanduser(str(model)))
    threads = _int(args.get("replica_threads"), 0)
    cpus = float(args.get("replica_cpus") or (threads if threads > 0 else 1))
    engine_kwargs = {k: args[k] for k in ("kv_budget_mb", "max_num_seqs", "max_queue") if args.get(k) is not None}
    max_ongoing = _int(args.get("max_ongoing_requests"), 64)
    options = dict(
        max_ongoing_requests=max_ongoing,
        ray_actor_options={"num_cpus": cpus},
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"spill_at": _int(args.get("spill_at"), DEFAULT_SPILL_AT)}),
        health_check_period_s=float(args.get("health_check_period_s") or 5.0),
        health_check_timeout_s=float(args.get("health_check_timeout_s") or 30.0),
        graceful_shutdown_timeout_s=float(args.get("graceful_shutdown_timeout_s") or 5.0),
    )
    if args.get("max_replicas") is not None:
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=_int(args.get("min_replicas"), 1),
            max_replicas=_int(args.get("max_replicas")),
            initial_replicas=_int(args.get("replicas")),
            target_ongoing_requests=float(args.get("target_ongoing_requests") or 8),
        )
    else:
        options["num_replicas"] = _int(args.get("replicas"), 1)
    engine = TinyLoopEngine.options(**options).bind(
        model, model_name=args.get("model_name"), threads=threads, timeout=float(args.get("timeout") or 0.0),
        api_key=args.get("api_key"), max_body_bytes=_int(args.get("max_body_bytes"), DEFAULT_MAX_BODY_BYTES),
        engine_kwargs=engine_kwargs, fault_injection=bool(args.get("fault_injection")))
    keys = {"chat": args.get("route_chat") or "history"}
    if args.get("route_prefix_chars") is not None:
        keys["prefix_chars"] = int(args["route_prefix_chars"])
    if args.get("route_prefix_tokens") is not None:
        keys["prefix_tokens"] = int(args["route_prefix_tokens"])
    KeyConfig(**keys)  # a bad value fails here, not in the replica
    return TinyLoopIngress.options(max_ongoing_requests=_int(args.get("ingress_max_ongoing_requests"), 1000)).bind(
        engine, keys=keys, max_body_bytes=_int(args.get("max_body_bytes"), DEFAULT_MAX_BODY_BYTES))
