"""The FastAPI app: routes, body parsing, and one error shape for everything.

Bodies are parsed here rather than by FastAPI's model binding, so that every way a body
can be wrong (not UTF-8, not JSON, NaN, a 5000-digit number, nesting deep enough to blow
the parser's stack, not an object, a field of the wrong type) ends as a 400 in OpenAI's
shape naming the field; FastAPI's own validation / HTTP errors (unknown path, wrong
method) are reshaped the same way by the handlers below.
"""
from __future__ import annotations

import json
import logging
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import chat_completions, completions, metrics
from .errors import ApiError, bad_param, error_response, from_api_error, from_validation_errors
from .job import ClientGone
from .middleware import Gate
from .prompts import chat_prompt_ids
from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

log = logging.getLogger("tinyloop.server")

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
DEFAULT_MAX_BODY_BYTES = 1 << 20


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


async def parse_body(request: Request, model_cls):
    body = await request.body()
    if not body.strip():
        raise bad_param(None, "the request body is empty: send a JSON object", "invalid_json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_param(None, f"the request body is not valid UTF-8 (byte {e.start})", "invalid_json") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_param(None, "the request body is nested too deeply", "invalid_json") from None
    except ValueError as e:  # JSONDecodeError, NaN / Infinity, over-long integers
        raise bad_param(None, f"the request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_param(None, f"the request body must be a JSON object, not {type(data).__name__}", "invalid_json")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None
    except RecursionError:
        raise bad_param(None, "the request body is nested too deeply", "invalid_json") from None


def create_app(state, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               static_dir: str = STATIC_DIR) -> FastAPI:
    """The app serving `state` (an EngineState). api_key: required as a Bearer token on the
    API routes when set. max_body_bytes: larger bodies get 413."""
    app = FastAPI(title="TinyLoop", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine_state = state

    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return from_api_error(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, e: RequestValidationError):
        return from_api_error(from_validation_errors(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        msg = {404: f"Unknown path {request.url.path}", 405: f"Method {request.method} is not allowed on "
               f"{request.url.path}"}.get(e.status_code, str(e.detail))
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return error_response(e.status_code, msg, None, code)

    @app.exception_handler(ClientGone)
    async def _gone(request, e):
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal server error: {type(e).__name__}: {e}", None, "internal_error")

    # ------------------------------------------------------------------ the page and ops

    @app.get("/", include_in_schema=False)
    async def index():
        page = os.path.join(static_dir, "index.html")
        if os.path.exists(page):
            return FileResponse(page, media_type="text/html")
        return error_response(404, "the chat page is not installed (static/index.html)", None, "not_found")

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok", "model": state.model_name}

    @app.get("/metrics")
    async def get_metrics():
        return PlainTextResponse(metrics.render(state), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ the API

    def model_card():
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "tinyloop",
                "max_model_len": state.max_seq_len, "default_loops": state.default_loops}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str):
        if model != state.model_name:
            raise ApiError(404, f"The model '{model}' does not exist", "model", "model_not_found")
        return model_card()

    @app.post("/v1/completions")
    async def v1_completions(request: Request):
        return await completions.handle(state, request, await parse_body(request, CompletionRequest))

    @app.post("/v1/chat/completions")
    async def v1_chat(request: Request):
        return await chat_completions.handle(state, request, await parse_body(request, ChatCompletionRequest))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse_body(request, TokenizeRequest)
        if req.model is not None and req.model != state.model_name:
            raise ApiError(404, f"The model '{req.model}' does not exist", "model", "model_not_found")
        if state.tokenizer is None:
            raise bad_param(None, "this model has no tokenizer")
        if req.messages is not None:
            ids = chat_prompt_ids(state, req.messages, req.add_generation_prompt)[0]
        else:
            ids = state.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_seq_len}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        # vLLM's endpoint: lm-evaluation-harness (local-completions) finds it and then
        # tokenizes through /tokenize and /detokenize instead of downloading a tokenizer
        if state.tokenizer is None:
            raise bad_param(None, "this model has no tokenizer")
        return {"tokenizer_class": "tokenizers.Tokenizer", "eos_token": state.special.get("eos_token"),
                "bos_token": state.special.get("bos_token"), "pad_token": None,
                "chat_template": state.template, "model_max_length": state.max_seq_len,
                "vocab_size": state.cfg["vocab_size"]}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_body(request, DetokenizeRequest)
        if req.model is not None and req.model != state.model_name:
            raise ApiError(404, f"The model '{req.model}' does not exist", "model", "model_not_found")
        vocab = state.cfg["vocab_size"]
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_param("tokens", f"token id {bad[0]} is out of range (the vocabulary has {vocab} ids)")
        return {"prompt": state.decode(req.tokens)}

    app.add_middleware(Gate, state=state, api_key=api_key, max_body_bytes=max_body_bytes)
    return app
