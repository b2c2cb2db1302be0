"""TinyLoop replicas on Ray Serve (python/tinyloop/scale, docs/scaling.md).

Without a cluster: the routing rules (keys, rendezvous hashing, spill to the least-loaded),
the request router class on stand-in replicas, the /metrics merge, and the ASGI bridge
(closing its generator reaches the app as http.disconnect: the engine request is cancelled
and its KV freed).

With one local Ray instance for the module (127.0.0.1 only, 2 engine replicas of one
thread each on the bundled model): the openai client through Serve's HTTP proxy, streamed
and not; a shared-prefix workload on one replica (its prefix-cache hits in /metrics, none on
the other); a replica dying before it answers (the request is retried on the other one);
a replica killed under a bounded load (only its requests fail, and only with the documented
retryable error; Serve replaces it; later requests succeed).
"""
import asyncio
import json
import os
import re
import signal
import socket
import sys
import time

import pytest

pytest.importorskip("ray.serve")
import httpx  # noqa: E402

from tinyloop.scale.routing import (KeyConfig, ReplicaView, merge_metrics, preferred_order,  # noqa: E402
                                    rank_replicas, routing_key)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
SYSTEM = ("You are the keeper of a lighthouse on a small rocky island. You answer questions about "
          "ships, storms, tides, lamps and the sea in short plain sentences, and you never make up "
          "facts about the weather you have not seen.")


def chat_body(messages, **kw):
    return json.dumps({"model": "m", "messages": messages, **kw}).encode()


# ---------------------------------------------------------------------------- routing keys

def test_chat_history_key_is_the_system_prompt_and_the_turns_before_the_last_user_turn():
    sys_msg = {"role": "system", "content": SYSTEM}
    hist = [sys_msg, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    k1 = routing_key("/v1/chat/completions", chat_body(hist + [{"role": "user", "content": "A?"}]))
    k2 = routing_key("/v1/chat/completions", chat_body(hist + [{"role": "user", "content": "B?"}], max_tokens=3))
    assert k1 is not None and k1 == k2  # same shared part, different last question
    other = [sys_msg, {"role": "user", "content": "yo"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "A?"}]
    assert routing_key("/v1/chat/completions", chat_body(other)) != k1
    # first turns of one system prompt share a key; a lone user turn has nothing to share
    f1 = routing_key("/v1/chat/completions", chat_body([sys_msg, {"role": "user", "content": "x"}]))
    f2 = routing_key("/v1/chat/completions", chat_body([sys_msg, {"role": "user", "content": "y"}]))
    assert f1 == f2 != k1
    assert routing_key("/v1/chat/completions", chat_body([{"role": "user", "content": "x"}])) is None


def test_chat_conversation_and_system_modes():
    conv, system = KeyConfig(chat="conversation"), KeyConfig(chat="system")
    s = {"role": "system", "content": SYSTEM}
    t1 = [s, {"role": "user", "content": "first"}]
    t2 = t1 + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "second"}]
    assert routing_key("/v1/chat/completions", chat_body(t1), conv) == \
        routing_key("/v1/chat/completions", chat_body(t2), conv)  # every turn of a conversation
    other = [s, {"role": "user", "content": "another"}]
    assert routing_key("/v1/chat/completions", chat_body(other), conv) != \
        routing_key("/v1/chat/completions", chat_body(t1), conv)
    assert routing_key("/v1/chat/completions", chat_body(other), system) == \
        routing_key("/v1/chat/completions", chat_body(t2), system)
    assert routing_key("/v1/chat/completions", chat_body(t2), KeyConfig(chat="none")) is None
    with pytest.raises(ValueError):
        KeyConfig(chat="everything")


def test_completion_key_is_the_prompts_first_k_characters_or_tokens():
    keys = KeyConfig(prefix_chars=40, prefix_tokens=4)
    shared = "x" * 40

    def key(prompt):
        return routing_key("/v1/completions", json.dumps({"prompt": prompt}).encode(), keys)

    assert key(shared + " one") == key(shared + " two") == key([shared + " three", "other"])
    assert key("short one") != key("short two")
    assert key([1, 2, 3, 4, 5]) == key([1, 2, 3, 4, 9]) != key([1, 2, 3, 5, 5])
    assert key("") is None
    assert routing_key("/v1/completions", b"{not json", keys) is None
    assert routing_key("/v1/completions", b"[1, 2]", keys) is None
    assert routing_key("/v1/models", b"", keys) is None
    assert routing_key("/tokenize", json.dumps({"prompt": shared}).encode(), keys) is None


# ---------------------------------------------------------------------------- ranking

def test_rendezvous_keys_stay_put_when_replicas_come_and_go():
    keys = [f"key-{i}" for i in range(2000)]
    four = ["r1", "r2", "r3", "r4"]
    owner = {k: preferred_order(k, four)[0] for k in keys}
    share = {r: sum(1 for k in keys if owner[k] == r) / len(keys) for r in four}
    assert all(0.18 < s < 0.32 for s in share.values()), share
    three = ["r1", "r2", "r4"]  # r3 died
    for k in keys:
        after = preferred_order(k, three)[0]
        if owner[k] != "r3":
            assert after == owner[k]  # nobody else's keys move
    five = four + ["r5"]  # a replica added: a key either stays or moves to the new one
    moved = 0
    for k in keys:
        after = preferred_order(k, five)[0]
        assert after in (owner[k], "r5")
        moved += after == "r5"
    assert 0.12 < moved / len(keys) < 0.28


def test_rank_rules_affinity_spill_pin_avoid_and_no_key():
    views = [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", None)]
    key = "k"
    pref = preferred_order(key, ["a", "b", "c"])
    ranks, decision = rank_replicas({"key": key}, views, spill_at=4)
    assert decision == "affinity" and ranks == [[pref[0]], pref[1:]]
    busy = [ReplicaView(v.id, 4 if v.id == pref[0] else v.queue_len) for v in views]
    ranks, decision = rank_replicas({"key": key}, busy, spill_at=4)
    assert decision == "spill" and ranks == [pref[1:], [pref[0]]]  # the least-loaded of the rest first
    below = [ReplicaView(v.id, 3 if v.id == pref[0] else v.queue_len) for v in views]
    assert rank_replicas({"key": key}, below, spill_at=4)[1] == "affinity"
    ranks, decision = rank_replicas({"key": None}, views, spill_at=4)
    assert decision == "least_loaded" and ranks == [["a", "b", "c"]]
    assert rank_replicas({"pin": "b"}, views, 4) == ([["b"]], "pinned")
    assert rank_replicas({"pin": "gone"}, views, 4) == ([], "pinned")
    ranks, _ = rank_replicas({"key": key, "avoid": [pref[0]]}, views, 4)
    assert pref[0] not in sum(ranks, []) and ranks[0] == [pref[1]]
    ranks, _ = rank_replicas({"key": key, "avoid": ["a", "b", "c"]}, views, 4)
    assert ranks[0] == [pref[0]]  # nothing else left: avoided ones are still tried
    assert rank_replicas({"key": key}, [], 4) == ([], "least_loaded")


class _FakeReplica:
    """What the router reads of a RunningReplica."""

    def __init__(self, unique_id):
        from ray.serve._private.common import DeploymentID, ReplicaID

        self.replica_id = ReplicaID(unique_id, DeploymentID(name="TinyLoopEngine", app_name="test"))
        self.max_ongoing_requests = 8
        self.queue_len = 0

    async def get_queue_len(self, *, deadline_s):
        return self.queue_len


def test_router_class_ranks_replicas_writes_back_and_publishes_them():
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest

    from tinyloop.scale import router as rmod
    from tinyloop.scale import routing

    async def main():
        r = rmod.PrefixAffinityRouter(deployment_id=DeploymentID(name="TinyLoopEngine", app_name="test"),
                                      handle_source=DeploymentHandleSource.UNKNOWN,
                                      use_replica_queue_len_cache=True)
        r.initialize_state(spill_at=2)
        reps = [_FakeReplica(i) for i in ("aaaa", "bbbb")]
        r.update_replicas(reps)
        assert routing.live("TinyLoopEngine") == ["aaaa", "bbbb"]
        route = {"key": "some-key"}
        pr = PendingRequest(args=[route, {}], kwargs={},
                            metadata=RequestMetadata(request_id="x", internal_request_id="ir-1"))
        ranks = await r.choose_replicas(r._replicas_list, pr)
        pref = preferred_order("some-key", ["aaaa", "bbbb"])
        assert [[x.replica_id.unique_id for x in rank] for rank in ranks] == [[pref[0]], [pref[1]]]
        assert pr.routing_context.should_backoff  # one pass per try: no busy loop
        r.on_new_queue_len_info(reps[["aaaa", "bbbb"].index(pref[0])].replica_id, 2)
        ranks = await r.choose_replicas(r._replicas_list, pr)
        assert ranks[0][0].replica_id.unique_id == pref[1]  # spilled
        r.on_request_completed(reps[0].replica_id, "ir-1")
        assert route["replica"] == "aaaa"  # written back for the ingress's retry
        r.on_replica_actor_died(reps[0].replica_id)
        assert routing.live("TinyLoopEngine") == ["bbbb"]
        assert await r.choose_replicas(r._replicas_list, PendingRequest(
            args=[{"pin": "aaaa"}], kwargs={}, metadata=RequestMetadata("y", "ir-2"))) == []

    asyncio.run(main())


def test_merge_metrics_labels_every_sample_by_replica():
    a = ('# HELP tinyloop_prefix_hits_total prefix cache hits\n# TYPE tinyloop_prefix_hits_total counter\n'
         'tinyloop_prefix_hits_total{model="m"} 3\n# HELP tinyloop_x x\n# TYPE tinyloop_x gauge\ntinyloop_x 1\n')
    b = a.replace("} 3", "} 0").replace("tinyloop_x 1", "tinyloop_x 2")
    out = merge_metrics({"r1": a, "r2": b})
    assert out.count("# HELP tinyloop_prefix_hits_total") == 1 and out.count("# TYPE tinyloop_x") == 1
    assert 'tinyloop_prefix_hits_total{replica="r1",model="m"} 3' in out
    assert 'tinyloop_prefix_hits_total{replica="r2",model="m"} 0' in out
    assert 'tinyloop_x{replica="r2"} 2' in out
    lines = out.splitlines()
    assert lines.index('tinyloop_x{replica="r1"} 1') > lines.index("# TYPE tinyloop_x gauge")


# ---------------------------------------------------------------------------- the ASGI bridge

def _request(method, path, body=None, headers=()):
    raw = json.dumps(body).encode() if body is not None else b""
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *headers]
    return {"method": method, "path": path, "query_string": b"", "headers": hdrs, "body": raw,
            "client": ["127.0.0.1", 5555]}


def test_bridge_closing_the_generator_is_a_disconnect_for_the_app():
    from tinyloop.scale.bridge import call_asgi

    seen = []

    async def app(scope, receive, send):
        seen.append(await receive())
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        seen.append(await receive())  # blocks until the consumer goes away

    async def main():
        gen = call_asgi(app, _request("POST", "/x", {"a": 1}), [(b"x-b", b"2")])
        start = await gen.__anext__()
        assert start == {"status": 201, "headers": [(b"x-a", b"1"), (b"x-b", b"2")]}
        assert await gen.__anext__() == b"one"
        await gen.aclose()

    asyncio.run(main())
    assert seen[0] == {"type": "http.request", "body": b'{"a": 1}', "more_body": False}
    assert seen[1] == {"type": "http.disconnect"}


def test_bridge_app_failing_before_its_response_is_a_500_in_openai_shape():
    from tinyloop.scale.bridge import call_asgi

    async def app(scope, receive, send):
        raise RuntimeError("boom")

    async def main():
        return [c async for c in call_asgi(app, _request("GET", "/"))]

    start, body = asyncio.run(main())
    assert start["status"] == 500
    assert json.loads(body)["error"]["code"] == "internal_error"


def test_bridge_serves_tinyloops_own_app_and_a_dropped_stream_frees_the_engine_request():
    from tinyloop.scale.bridge import call_asgi
    from tinyloop.server import EngineState, create_app

    state = EngineState(MODEL)
    app = create_app(state)
    try:
        async def main():
            chunks = [c async for c in call_asgi(app, _request("POST", "/v1/completions",
                                                               {"prompt": "Once upon a time", "max_tokens": 4}))]
            assert chunks[0]["status"] == 200
            body = json.loads(b"".join(chunks[1:]))
            assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] >= 1

            gen = call_asgi(app, _request("POST", "/v1/completions", {"prompt": "Once upon a time",
                                          "max_tokens": 200, "loops": 32, "stream": True}))
            start = await gen.__anext__()
            assert start["status"] == 200
            assert (await gen.__anext__()).startswith(b"data: ")
            await gen.aclose()  # the client went away after the first event

        asyncio.run(main())
        deadline = time.monotonic() + 20
        while True:
            s = state.stats()
            if s["requests_cancelled"] >= 1 and s["running"] == 0 and s["kv_blocks_used"] == s["kv_blocks_cached"]:
                break
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
        assert s["generated_tokens"] < 200 + 4
    finally:
        state.close()


def test_engine_replica_health_check_fails_once_its_engine_is_closed():
    from tinyloop.scale.app import TinyLoopEngine

    import tinyloop_py as tl

    # the class itself, outside Serve; threads=0 leaves this process's thread pool alone
    replica = TinyLoopEngine.func_or_class(MODEL, threads=0)
    try:
        replica.check_health()
        rid, text = replica.metrics()
        assert f'pid="{os.getpid()}",threads="{tl.get_num_threads()}"' in text
        assert "tinyloop_prefix_hits_total" in text
        replica.state.engine.close()  # closed (or broken) under the replica's feet
        with pytest.raises(RuntimeError, match="closed"):
            replica.check_health()
    finally:
        replica.__del__()


# ---------------------------------------------------------------------------- on Ray Serve

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_metrics(base: str) -> dict:
    """{replica id: {metric name: value}} from the ingress's /metrics (pid too)."""
    text = httpx.get(base + "/metrics", timeout=30).text
    out: dict = {}
    for m in re.finditer(r'^(tinyloop_[a-z_]+)\{replica="([^"]+)"([^}]*)\} (\S+)$', text, re.M):
        name, rid, rest, value = m.groups()
        d = out.setdefault(rid, {})
        d[name] = float(value)
        pid = re.search(r'pid="(\d+)"', rest)
        if pid:
            d["pid"] = int(pid.group(1))
    return out


def ingress_counter(base: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(base + "/metrics", timeout=30).text, re.M)
    return float(m.group(1))


def wait_for_replicas(base: str, n: int, timeout: float, exclude=()) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            reps = replica_metrics(base)
        except httpx.HTTPError:
            reps = {}
        if len(reps) == n and not set(reps) & set(exclude) and all("pid" in r for r in reps.values()):
            return reps
        assert time.monotonic() < deadline, f"replicas: {sorted(reps)} (want {n}, not {sorted(exclude)})"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ray_app(tmp_path_factory):
    from tinyloop.scale.serve import deploy, start_local_ray, stop

    from ray._private import ray_constants

    port = _free_port()
    t0 = time.monotonic()
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                            "RAY_USAGE_STATS_ENABLED")}
    cluster = ray_constants.ENABLE_RAY_CLUSTER
    start_local_ray(num_cpus=2, port=port)
    try:
        deploy({"model": MODEL, "replicas": 2, "replica_threads": 1, "health_check_period_s": 1,
                "fault_injection": True})
        base = f"http://127.0.0.1:{port}"
        reps = wait_for_replicas(base, 2, 60)
        print(f"\nRay + Serve + 2 replicas up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        yield {"base": base, "tmp": tmp_path_factory.mktemp("ray"), "replicas": reps}
    finally:
        stop()
        ray_constants.ENABLE_RAY_CLUSTER = cluster  # what start_local_ray changed for the instance
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_ray_listens_on_loopback_only(ray_app):
    import ray

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    port = int(ray_app["base"].rsplit(":", 1)[1])
    bound = []  # local addresses listening on the HTTP proxy's port (/proc/net/tcp: hex ip:port, state 0A)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                ip, p = local.rsplit(":", 1)
                if state == "0A" and int(p, 16) == port:
                    bound.append(ip)
    assert bound and all(ip in ("0100007F", "0000000000000000FFFF00000100007F") for ip in bound), bound


def test_openai_client_streamed_and_not_through_the_http_proxy(ray_app):
    import openai

    client = openai.OpenAI(base_url=ray_app["base"] + "/v1", api_key="unused", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == ["tinyloop-demo"]
    raw = client.completions.with_raw_response.create(model="tinyloop-demo", prompt="Once upon a time",
                                                      max_tokens=6, temperature=0)
    assert raw.headers["x-tinyloop-replica"] in ray_app["replicas"]
    c = raw.parse()
    assert c.object == "text_completion" and c.choices[0].text and c.usage.completion_tokens >= 1
    again = client.completions.create(model="tinyloop-demo", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert again.choices[0].text == c.choices[0].text  # greedy, whichever replica

    stream = client.chat.completions.create(model="tinyloop-demo", stream=True, max_tokens=8,
                                            messages=[{"role": "user", "content": "Tell me a story"}],
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text and finish in (["length"], ["stop"]) and chunks[-1].usage.completion_tokens >= 1

    with pytest.raises(openai.BadRequestError) as e:  # the single server's own error shape
        client.completions.create(model="tinyloop-demo", prompt="x", max_tokens=6, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)

    page = httpx.get(ray_app["base"] + "/", timeout=30)  # the chat page, a file response, relayed
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert len(page.content) == int(page.headers["content-length"])
    big = httpx.post(ray_app["base"] + "/v1/completions", content=b"x" * ((1 << 20) + 1),
                     headers={"content-type": "application/json"}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_shared_prefix_workload_lands_on_one_replica_and_hits_its_prefix_cache(ray_app):
    import openai

    base = ray_app["base"]
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    before = replica_metrics(base)
    history = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "Is a storm coming tonight?"},
               {"role": "assistant", "content": "The glass is falling and the gulls have gone inland."}]

    async def ask(q):
        raw = await client.chat.completions.with_raw_response.create(
            model="tinyloop-demo", max_tokens=3, messages=history + [{"role": "user", "content": q}])
        return raw.headers["x-tinyloop-replica"]

    async def main():
        first = await ask("Should the boats stay in?")  # puts the shared prefix in one replica's cache
        # then five at once: least-loaded routing would spread them over both replicas
        rest = await asyncio.gather(*(ask(q) for q in ("When is high tide?", "Is the lamp lit?",
                                                       "How tall is the tower?", "Who built it?",
                                                       "Do you see a ship?")))
        return [first, *rest]

    served = asyncio.run(main())
    assert len(set(served)) == 1, served
    after = replica_metrics(base)
    hits = {r: after[r]["tinyloop_prefix_hits_total"] - before.get(r, {}).get("tinyloop_prefix_hits_total", 0)
            for r in after}
    assert hits[served[0]] >= 5, hits  # every request after the first reused the shared prefix
    assert all(h == 0 for r, h in hits.items() if r != served[0]), hits
    assert after[served[0]]["tinyloop_prefix_hit_tokens_total"] - \
        before[served[0]]["tinyloop_prefix_hit_tokens_total"] >= 5 * 32


def test_client_disconnect_cancels_the_engine_request_on_its_replica(ray_app):
    base = ray_app["base"]
    before = replica_metrics(base)
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", base + "/v1/completions", json={
                "prompt": "The old lighthouse keeper said", "max_tokens": 220, "loops": 32, "stream": True}) as r:
            assert r.status_code == 200
            replica = r.headers["x-tinyloop-replica"]
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break  # one token came: hang up
    deadline = time.monotonic() + 30
    while True:
        m = replica_metrics(base)[replica]
        cancelled = m["tinyloop_requests_cancelled_total"] - before[replica]["tinyloop_requests_cancelled_total"]
        if cancelled >= 1 and m["tinyloop_running_requests"] == 0 and \
                m["tinyloop_kv_blocks_used"] == m["tinyloop_kv_blocks_cached"]:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.25)
    generated = m["tinyloop_engine_generated_tokens_total"] - before[replica]["tinyloop_engine_generated_tokens_total"]
    assert generated < 220


async def _stream(client, base, body):
    """(status, replica, events, error type or None, finish reasons) of one streamed request."""
    try:
        async with client.stream("POST", base + "/v1/completions", json=body) as r:
            replica = r.headers.get("x-tinyloop-replica")
            if r.status_code != 200:
                err = json.loads(await r.aread())["error"]
                return r.status_code, replica, 0, err["type"], []
            events, err, finish, done = 0, None, [], False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    err = obj["error"]["type"]
                    continue
                events += 1
                finish += [ch["finish_reason"] for ch in obj["choices"] if ch.get("finish_reason")]
            if err is None and not (done and finish):
                err = "incomplete stream"
            return 200, replica, events, err, finish
    except httpx.HTTPError as e:
        return None, None, 0, f"{type(e).__name__}: {e}", []


def test_replica_dying_before_it_answers_is_retried_on_the_other(ray_app):
    base = ray_app["base"]
    reps = wait_for_replicas(base, 2, 60)
    retries = ingress_counter(base, "tinyloop_ray_retries_total")
    marker = ray_app["tmp"] / "fault-once"
    r = httpx.post(base + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4},
                   headers={"x-tinyloop-fault": f"exit-once:{marker}"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]
    assert marker.exists()  # a replica took it and died before answering
    assert ingress_counter(base, "tinyloop_ray_retries_total") == retries + 1
    survivor = r.headers["x-tinyloop-replica"]
    assert survivor in reps
    dead = (set(reps) - {survivor}).pop()
    wait_for_replicas(base, 2, 90, exclude=[dead])  # Serve replaced it


def test_replica_killed_under_load_fails_only_its_requests_with_the_retryable_error(ray_app):
    base = ray_app["base"]
    reps = wait_for_replicas(base, 2, 90)
    prompts = [f"{i}. The train left the station at midnight and" for i in range(12)]
    body = {"max_tokens": 200, "loops": 32, "stream": True, "temperature": 0.0}

    async def main():
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
            tasks = [asyncio.create_task(_stream(client, base, dict(body, prompt=p))) for p in prompts]
            # kill the replica once it is streaming: through /metrics, its running requests
            deadline = time.monotonic() + 60
            victim = None
            while victim is None:
                await asyncio.sleep(0.3)
                m = await asyncio.to_thread(replica_metrics, base)
                busy = [r for r in m if m[r].get("tinyloop_engine_generated_tokens_total", 0)
                        - reps[r].get("tinyloop_engine_generated_tokens_total", 0) >= 10
                        and m[r].get("tinyloop_running_requests", 0) >= 1]
                if busy:
                    victim = busy[0]
                assert time.monotonic() < deadline, "no replica got busy"
            os.kill(int(m[victim]["pid"]), signal.SIGKILL)
            later = [asyncio.create_task(_stream(client, base, dict(body, prompt=f"after {i}", max_tokens=20)))
                     for i in range(4)]
            return victim, await asyncio.gather(*tasks), await asyncio.gather(*later)

    victim, results, later = asyncio.run(main())
    print(f"\nkilled {victim}: (status, replica, events, error, finish) of each request:\n  "
          + "\n  ".join(map(str, results + later)), file=sys.stderr)
    cut = [r for r in results if r[3] is not None]
    assert cut, "the kill cut no stream"
    for status, replica, events, err, finish in results + later:
        if err is None:
            assert status == 200 and finish
            continue
        # only the killed replica's requests fail, and only with the documented retryable error
        assert (status, err) in ((200, "replica_failed"), (503, "replica_failed")), (status, replica, err)
        assert status == 503 or replica == victim, (status, replica, err)
    survivor = (set(reps) - {victim}).pop()
    assert any(r[1] == survivor and r[3] is None for r in results + later)

    new = wait_for_replicas(base, 2, 90, exclude=[victim])  # Serve brought a replica back
    assert survivor in new
    with httpx.Client(timeout=60) as c:
        for i in range(4):
            r = c.post(base + "/v1/completions", json={"prompt": f"Later {i}: once upon a time", "max_tokens": 4})
            assert r.status_code == 200, r.text
            assert r.headers["x-tinyloop-replica"] in new
    assert ingress_counter(base, "tinyloop_ray_responses_cut_total") >= len(cut)


def test_the_documented_serve_run_config_is_valid_and_builds():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from tinyloop.scale.app import build_app

    with open(os.path.join(ROOT, "python", "tinyloop", "scale", "serve_config.yaml")) as f:
        config = yaml.safe_load(f)
    ServeDeploySchema.model_validate(config)
    (app_cfg,) = config["applications"]
    assert app_cfg["import_path"] == "tinyloop.scale.app:build_app"
    app = build_app(dict(app_cfg["args"], model=MODEL))
    engine = app._bound_deployment.init_args[0]._bound_deployment  # ingress(engine, ...)
    auto = engine._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.target_ongoing_requests) == (1, 8, 16)
    assert engine._deployment_config.max_ongoing_requests == 64
    assert engine.ray_actor_options["num_cpus"] == 8
    with pytest.raises(ValueError):
        build_app(dict(app_cfg["args"], model=MODEL, route_chat="everything"))


def test_tinyloop_serve_ray_flags_reach_the_application(monkeypatch):
    import argparse

    from tinyloop.scale import serve as scale_serve
    from tinyloop.scale.app import build_app
    from tinyloop.server import serve as server_serve

    p = argparse.ArgumentParser()
    server_serve.add_arguments(p)
    args = p.parse_args([MODEL, "--ray", "--replicas", "3", "--replica-threads", "2", "--max-replicas", "5",
                         "--target-ongoing-requests", "4", "--spill-at", "7", "--route-chat", "conversation",
                         "--kv-budget-mb", "64", "--api-key", "k"])
    opts = scale_serve.app_options(args)
    assert opts["replicas"] == 3 and opts["replica_threads"] == 2 and opts["max_replicas"] == 5
    assert opts["kv_budget_mb"] == 64 and opts["api_key"] == "k" and opts["route_chat"] == "conversation"
    app = build_app(opts)
    engine = app._bound_deployment.init_args[0]._bound_deployment
    cfg = engine._deployment_config
    assert (cfg.autoscaling_config.min_replicas, cfg.autoscaling_config.max_replicas,
            cfg.autoscaling_config.initial_replicas, cfg.autoscaling_config.target_ongoing_requests) == (1, 5, 3, 4)
    assert cfg.request_router_config.request_router_kwargs == {"spill_at": 7}
    assert engine.init_kwargs["threads"] == 2 and engine.init_kwargs["engine_kwargs"] == {"kv_budget_mb": 64}
    assert engine.ray_actor_options["num_cpus"] == 2

    seen = []
    monkeypatch.setattr(scale_serve, "run", lambda a: seen.append(a) or 0)
    assert server_serve.run(args) == 0 and seen == [args]  # `tinyloop serve --ray` goes to tinyloop.scale
