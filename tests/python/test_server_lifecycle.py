"""Requests ending other than normally: a client that disconnects (its KV blocks go back to
the pool at once), --timeout (408, or a stream's last chunk with finish_reason "timeout"),
SIGTERM (the drain: in-flight streams finish, new requests get 503, exit 0), and a burst
of concurrent mixed requests that must all end."""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import socket
import time

import httpx
import pytest

from server_helpers import serve_subprocess, server_in_thread, wait_until

SLOW = {"prompt": "Once upon a time", "max_tokens": 200, "loops": 64, "temperature": 0}  # several seconds


def live_blocks(state) -> int:
    """KV blocks held by requests (the prefix cache's own blocks are not a request's)."""
    s = state.stats()
    return s["kv_blocks_used"] - s["kv_blocks_cached"]


@pytest.fixture(scope="module")
def srv():
    with server_in_thread() as s:
        yield s


def test_stream_disconnect_frees_kv(srv):
    before = srv.state.stats()["requests_cancelled"]
    with httpx.stream("POST", srv.url + "/v1/completions", json=dict(SLOW, stream=True), timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events: the request is running
        assert any(line.startswith("data: {") for line in got)
        assert live_blocks(srv.state) > 0 and srv.state.stats()["running"] == 1
    # the connection is closed: the request is cancelled at the engine's next step
    assert wait_until(lambda: srv.state.stats()["running"] == 0, timeout=5)
    assert live_blocks(srv.state) == 0
    assert srv.state.stats()["requests_cancelled"] == before + 1


def test_non_stream_disconnect_frees_kv(srv):
    before = srv.state.stats()["requests_cancelled"]
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=SLOW, timeout=httpx.Timeout(30, read=0.5))
    assert wait_until(lambda: srv.state.stats()["running"] == 0, timeout=5)
    assert time.monotonic() - t0 < 4  # far sooner than the request would have taken
    assert live_blocks(srv.state) == 0
    assert srv.state.stats()["requests_cancelled"] == before + 1


def test_n_choices_disconnect_cancels_all(srv):
    with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "loops": 64,
                            "n": 3, "seed": 1, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(8):
            next(lines)
    assert wait_until(lambda: srv.state.stats()["running"] == 0 and srv.state.stats()["waiting"] == 0, timeout=5)
    assert live_blocks(srv.state) == 0


def test_timeout():
    with server_in_thread(timeout=0.3) as s:
        r = httpx.post(s.url + "/v1/completions", json=SLOW, timeout=30)
        assert r.status_code == 408
        err = r.json()["error"]
        assert err["code"] == "timeout" and err["type"] and err["message"]
        with httpx.stream("POST", s.url + "/v1/completions", json=dict(SLOW, stream=True), timeout=30) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] == "timeout"
        assert s.state.stats()["requests_timed_out"] == 2
        assert wait_until(lambda: live_blocks(s.state) == 0)
        # fast requests are not affected
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_sigterm_drains_then_exits_zero():
    with serve_subprocess() as (proc, url):
        body = {"prompt": "Once upon a time", "max_tokens": 60, "loops": 48, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            events = [next(lines)]
            proc.send_signal(signal.SIGTERM)
            # draining: health says so, new API requests are refused with 503
            assert wait_until(lambda: httpx.get(url + "/health", timeout=5).status_code == 503, timeout=10)
            refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
            events += list(lines)  # the stream in flight runs to its end
        data = [e[6:] for e in events if e.startswith("data: ")]
        assert data[-1] == "[DONE]"
        finals = [json.loads(d)["choices"][0] for d in data[:-1]]
        assert finals[-1]["finish_reason"] == "length"
        assert len(finals[-1]["tinyloop"]["loops_per_token"]) == 60
        assert proc.wait(30) == 0, proc.stdout.read()
        out = proc.stdout.read()
        assert "draining" in out and "stopped" in out
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()


def test_concurrent_mixed_burst(srv):
    """Streams and non-streams, n = 1..3, stop strings that hit mid-token, sampling: every
    request ends, and the engine is idle afterwards."""
    def one(i):
        body = {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8, "stream": i % 2 == 0,
                "stop": ["e", " t"], "n": 1 + i % 3, "seed": i}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        if body["stream"]:
            assert r.text.rstrip().endswith("data: [DONE]")
            finals = [json.loads(line[6:])["choices"][0]["finish_reason"] for line in r.text.splitlines()
                      if line.startswith("data: {")]
            assert len([f for f in finals if f]) == body["n"]
        else:
            assert len(r.json()["choices"]) == body["n"]
        return True

    with cf.ThreadPoolExecutor(8) as ex:
        assert all(ex.map(one, range(160)))
    assert wait_until(lambda: srv.state.stats()["running"] == 0)
    assert live_blocks(srv.state) == 0
