"""Request bodies of the OpenAI API as pydantic models, and their mapping to the engine's
SamplingParams (docs/server.md, "Parameters").

Strict where OpenAI answers 400: unknown fields are refused (`extra="forbid"`), types are
not coerced (`strict`: "5" is not an int, 1 is not a bool), numbers have ranges (a huge
max_tokens is refused here, not by the engine), NaN / Infinity are refused. Parameters of
OpenAI's API that this server does not implement (tools, logit_bias, best_of > 1, suffix)
are accepted by name and refused with a 400 that says so, rather than ignored.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import bad_param

INT64 = 2**63 - 1
MAX_TOKENS_LIMIT = 1_000_000  # a bound for the type check; the context limit is checked later
MAX_N = 16                    # choices per prompt: each holds its own KV
MAX_STOPS = 16
MAX_LOGPROBS = 20
MAX_CHOICES = 256             # prompts x n of one /v1/completions request (a batch of an eval harness)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Float = Annotated[float, Field(allow_inf_nan=False)]


class EarlyExit(_Strict):
    """The early-exit settings of Model.generate (docs/loop-depth.md), without the prefix."""
    patience: int = Field(0, ge=0, le=1000)
    min_L: int = Field(2, ge=1, le=100000)
    tau: Float = Field(1e-3, ge=0)
    peek_every: int = Field(1, ge=1, le=100000)
    logit_margin: Float = Field(0.0, ge=0)


class ExitGate(_Strict):
    """Ouro's exit gate settings of Model.generate (docs/loop-depth.md "Exit gate"), without
    the prefix; an absent field keeps the model file's rule."""
    mode: Literal["off", "threshold", "step", "weighted"] | None = None
    threshold: Float | None = Field(None, ge=0, le=1)
    step: int | None = Field(None, ge=1, le=4096)
    kv: Literal["latest", "full"] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's name; accepted, same as include_usage at the end


class JsonSchemaFormat(_Strict):
    name: str = Field("schema", max_length=256)
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Strict):
    """Fields both endpoints share."""
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_LIMIT)
    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=INT64)
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Float] | None = None
    user: str | None = Field(None, max_length=4096)
    response_format: ResponseFormat | None = None
    # extensions (docs/server.md)
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    repetition_penalty: Float | None = Field(None, gt=0, le=100)
    loops: int | None = Field(None, ge=1, le=100_000)
    early_exit: EarlyExit | None = None
    exit_gate: ExitGate | None = None
    regex: str | None = Field(None, max_length=100_000)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return v
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        if any(s == "" for s in stops):
            raise ValueError("a stop string must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return v

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise bad_param("stream_options", "stream_options is only allowed when stream is true")
        return self

    def stop_list(self) -> list[str]:
        return list(self.stop or [])


class CompletionRequest(_Sampling):
    prompt: Any  # checked by _prompt (a union's errors would not name the problem)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        def ids(x):
            if not x:
                raise ValueError("a token id prompt must not be empty")
            if not all(type(t) is int for t in x):
                raise ValueError("expected a string, a list of token ids, or a list of those")
            return x

        if isinstance(v, str):
            if v == "":
                raise ValueError("the prompt must not be empty")
            return [v]
        if isinstance(v, list) and v:
            if all(type(t) is int for t in v):
                return [ids(v)]
            if all(isinstance(t, str) for t in v):
                if any(t == "" for t in v):
                    raise ValueError("a prompt must not be empty")
                return list(v)
            if all(isinstance(t, list) for t in v):
                return [ids(t) for t in v]
        if isinstance(v, list) and not v:
            raise ValueError("the prompt list must not be empty")
        raise ValueError("expected a string, a list of token ids, or a list of those")

    @model_validator(mode="after")
    def _checks(self):
        if self.suffix is not None:
            raise bad_param("suffix", "suffix is not supported (this model has no fill-in-the-middle mode)",
                            "unsupported_parameter")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_param("best_of", "best_of other than n is not supported", "unsupported_parameter")
        if self.max_tokens == 0 and not self.echo:
            raise bad_param("max_tokens", "max_tokens must be at least 1 (0 only with echo)")
        if len(self.prompt) * self.n > MAX_CHOICES:
            raise bad_param("prompt", f"at most {MAX_CHOICES} prompts x n per request, got {len(self.prompt) * self.n}")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    refusal: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v):
        if isinstance(v, list):
            for part in v:
                if isinstance(part, dict) and part.get("type") not in (None, "text"):
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported (text only)")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # OpenAI parameters this server refuses when set (tool calling needs a model trained for it)
    tools: list | None = None
    tool_choice: Any = None
    functions: list | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    # accepted and ignored: bookkeeping of OpenAI's platform
    store: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _checks(self):
        for name in ("tools", "tool_choice", "functions", "function_call"):
            if getattr(self, name) not in (None, []):
                raise bad_param(name, f"{name} is not supported by this server (no tool calling)",
                                "unsupported_parameter")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad_param("max_tokens", "max_tokens must be at least 1")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise bad_param("max_completion_tokens", "max_tokens and max_completion_tokens differ: pass one")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_param("top_logprobs", "top_logprobs needs logprobs: true")
        if self.messages[-1].role == "assistant" and self.messages[-1].content is None:
            raise bad_param("messages", "the last message has no content")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one(self):
        if (self.prompt is None) == (self.messages is None):
            raise bad_param("prompt", "pass exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(..., max_length=1_000_000)


def engine_kwargs(req: _Sampling, max_tokens: int, vocab_size: int) -> dict:
    """SamplingParams keyword arguments of a request (every OpenAI field and extension has
    one; `stop`, `n`, `logprobs`, `grammar` and `timeout` are added by the caller)."""
    kw: dict = {"max_tokens": max_tokens,
                "temperature": 1.0 if req.temperature is None else req.temperature,
                "top_p": 1.0 if req.top_p is None else req.top_p,
                # OpenAI has no top-k: off (every token) unless asked; 0 means off too
                "top_k": min(req.top_k or vocab_size, vocab_size),
                "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty}
    if req.loops is not None:
        kw["loops"] = req.loops
    if req.seed is not None:
        kw["seed"] = req.seed % 2**64  # the engine's seed is unsigned; OpenAI's is int64
    # Sent only when set, so an engine build without them still serves everything else.
    if req.presence_penalty:
        kw["presence_penalty"] = req.presence_penalty
    if req.frequency_penalty:
        kw["frequency_penalty"] = req.frequency_penalty
    ee = req.early_exit
    if ee is not None and ee.patience > 0:
        kw.update(early_exit_patience=ee.patience, early_exit_min_L=ee.min_L, early_exit_tau=ee.tau,
                  early_exit_peek_every=ee.peek_every, early_exit_logit_margin=ee.logit_margin)
    gate = req.exit_gate
    if gate is not None:
        for field, value in (("mode", gate.mode), ("threshold", gate.threshold), ("step", gate.step),
                             ("kv", gate.kv)):
            if value is not None:
                kw["exit_gate" if field == "mode" else f"exit_gate_{field}"] = value
    return kw
