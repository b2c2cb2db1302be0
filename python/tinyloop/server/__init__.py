"""`tinyloop serve`: an OpenAI-compatible HTTP server over the serving engine
(docs/server.md).

    from tinyloop.server import EngineState, create_app
    state = EngineState("models/tinyloop-demo.tinyloop", kv_budget_mb=256)
    app = create_app(state, api_key=None)      # an ASGI app: uvicorn.run(app, ...)

Files, one job each: app.py (routes), protocol.py (request models -> SamplingParams),
params.py (context, stops, grammar), job.py (a request's choices, n > 1), generation.py
(one choice on the event loop), stops.py (stop strings), logprobs.py, completions.py and
chat_completions.py (the response shapes), schema.py (JSON schema -> grammar), errors.py,
middleware.py (auth, body limit, drain, counting), metrics.py, sse.py, serve.py (the CLI).
"""
__all__ = ["EngineState", "create_app"]


def __getattr__(name):  # lazy: `tinyloop --help` must not import FastAPI and the engine
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "EngineState":
        from .state import EngineState
        return EngineState
    raise AttributeError(name)
