"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the
status an OpenAI client expects (docs/server.md, "Errors").

Handlers raise `ApiError`; the app's exception handlers turn it (and FastAPI's own
validation / HTTP errors, and anything unexpected) into that JSON, so no response of the
server has another error shape.
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

# status -> OpenAI's error type (what their API answers for the same class of problem)
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """An error answered with `status` and OpenAI's error JSON. `param` names the request
    field at fault (None when the request as a whole is), `code` a machine-readable
    reason (OpenAI's where one exists: model_not_found, invalid_api_key, ...)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def bad_param(param: str | None, message: str, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def from_api_error(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return error_response(e.status, e.message, e.param, e.code, headers)


def loc_to_param(loc) -> str | None:
    """A pydantic error location ('body', 'messages', 0, 'content') as OpenAI writes a
    param: 'messages[0].content'."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path"):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith("function-") or part in ("str", "int", "list[int]")):
            continue  # pydantic's union-member tags, not request fields
        else:
            out += ("." if out else "") + str(part)
    return out or None


def from_validation_errors(errors) -> ApiError:
    """The first pydantic error of a request body as a 400 naming its field."""
    errors = list(errors)
    if not errors:
        return bad_param(None, "invalid request")
    e = errors[0]
    param = loc_to_param(e.get("loc", ()))
    kind = e.get("type", "")
    msg = e.get("msg", "invalid value")
    if kind == "extra_forbidden":
        return bad_param(param, f"Unrecognized request argument supplied: {param}", "unknown_parameter")
    if kind == "missing":
        return bad_param(param, f"Missing required parameter: '{param}'.", "missing_required_parameter")
    if kind == "json_invalid":
        return bad_param(None, f"The request body is not valid JSON: {e.get('ctx', {}).get('error', msg)}",
                         "invalid_json")
    code = "invalid_type" if "type" in kind else "invalid_value"
    return bad_param(param, f"Invalid value for '{param}': {msg}", code)
