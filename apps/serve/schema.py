"""The request and response types of `quest-ort serve` as pydantic models: what /openapi.json documents.
The requests are checked by requests.py (every field read, ignored only where it changes nothing, or
refused naming it); these models describe them, field by field, with the ranges it enforces."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...runtime.sampling import PENALTY_RANGE, REPETITION_MAX, TEMPERATURE_MAX
from ...runtime.slots import LOGPROBS_MAX
from .requests import STOP_CHARS_MAX, STOP_STRINGS_MAX


class Sampled(BaseModel):
    """The generation fields both endpoints take."""

    model_config = ConfigDict(extra="allow")  # other fields: refused by requests.py unless they change nothing

    model: str | None = Field(None, description="the served model's name (GET /v1/models); others are refused")
    max_tokens: int | None = Field(None, ge=0, description="default: up to the context")
    temperature: float | None = Field(None, ge=0, le=TEMPERATURE_MAX, description="default 1; 0: greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0: no cut (vLLM / llama.cpp field)")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM / llama.cpp field")
    presence_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    frequency_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])
    repetition_penalty: float | None = Field(None, gt=0, le=REPETITION_MAX, description="vLLM / llama.cpp field")
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = Field(None, description=f"up to {STOP_STRINGS_MAX} strings of up to "
                                                           f"{STOP_CHARS_MAX} characters")
    stream: bool = False
    stream_options: dict | None = Field(None, description='{"include_usage": bool} only')
    user: str | None = None


class Message(BaseModel):
    role: str
    content: str | list[dict] = Field(description="a string, or text parts")


class ChatCompletionRequest(Sampled):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX, description="needs logprobs: true")


class CompletionRequest(Sampled):
    prompt: str | list[str] | list[int] = Field(description="a string (or a list of one), or token ids")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens the slot's cache held (not prefilled again)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timings(BaseModel):
    """llama.cpp's server's timings block (prompt: the tokens prefilled)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float | None
    prompt_per_second: float | None
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float | None
    predicted_per_second: float | None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    finish_reason: Literal["stop", "length"]
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class TextChoice(BaseModel):
    index: int
    finish_reason: Literal["stop", "length"]
    text: str
    logprobs: None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    timings: Timings


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERRORS = {400: {"model": ErrorResponse, "description": "a field it cannot honour, named"},
          413: {"model": ErrorResponse, "description": "a body past 8 MiB"},
          503: {"model": ErrorResponse, "description": "every slot busy and the queue full (Retry-After)"}}


def documented(request: type[BaseModel], response: type[BaseModel]) -> dict:
    """The route arguments that document `request` as its JSON body and `response` (or an SSE stream)
    as its answer, the body still read and checked by requests.py."""
    return {"openapi_extra": {"requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}}}},
            "responses": {200: {"model": response, "description": "the reply; with stream: true, server-sent events "
                                                                  "of its chunks"}, **ERRORS}}


def with_request_schemas(openapi: dict) -> dict:
    """`openapi` with the request models (and the models they hold) among its component schemas,
    where documented() points."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in (ChatCompletionRequest, CompletionRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi
