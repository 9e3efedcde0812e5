"""What a request to `quest-ort serve` asks for, checked field by field before any model work: pure
functions of the request's JSON (tested without a server)."""

from __future__ import annotations

import dataclasses

from ...runtime.sampling import Sampling
from ...runtime.slots import LOGPROBS_MAX

# Every field of a request is one of three kinds; any other is refused (a 400 naming it), never
# accepted and ignored. Fields this server reads:
READ_FIELDS = frozenset({"model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                   "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed", "stop", "logprobs", "top_logprobs"})
# Fields that change nothing of the output (who asks, what to record about it):
NO_EFFECT_FIELDS = frozenset({"user", "metadata", "store"})
# Fields accepted only at a value that asks for nothing more than what this server does:
ONLY_AT_FIELDS = {"n": (1,), "best_of": (1,), "echo": (False,), "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
            "parallel_tool_calls": (False,), "suffix": ("",), "logit_bias": ({},),
            "response_format": ({"type": "text"},), "modalities": (["text"],)}
# Sampling fields of a request, by their name in the request and in Sampling (runtime/sampling.py).
SAMPLING_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "presence_penalty": float,
                    "frequency_penalty": float, "repetition_penalty": float, "seed": int}
STOP_STRINGS_MAX, STOP_CHARS_MAX = 4, 256  # OpenAI's count; a stop string is held back that long at most
BODY_BYTES_MAX = 8 << 20  # a request body past it is refused (413) before it is parsed


class RequestError(ValueError):
    """A request this server refuses (HTTP 400; 413 for a body too large), naming the field."""

    def __init__(self, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.kind = param, kind

    @property
    def status(self) -> int:
        return 413 if self.kind == "too_large" else 400



@dataclasses.dataclass(frozen=True)
class Asked:
    """A checked request: its prompt ids, sampling, stop strings and log-probabilities' alternatives
    (None: none asked for)."""

    prompt: list[int]
    sampling: Sampling
    stop: tuple[str, ...]
    logprobs: int | None


def number_field(body: dict, name: str, default, kind=float):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise RequestError(f"'{name}' must be {'a number' if kind is float else 'an integer'}, got {value!r}", name)
    return kind(value)


def message_text(content, index: int) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text parts are read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(f"messages[{index}].content must be a string or text parts", f"messages[{index}].content")


def chat_messages(body: dict) -> list[dict]:
    """The request's messages as {role, content} strings (the chat template's input)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        checked.append({"role": message["role"], "content": message_text(message.get("content"), i)})
    return checked


def check_text_length(characters: int, capacity: int, longest_token: int, field: str) -> None:
    """Refuses text that cannot fit the context before it is tokenized: a token holds at most
    `longest_token` characters, so text longer than capacity x that is past the context, and
    tokenizing it would be work for nothing."""
    if characters > capacity * longest_token:
        raise RequestError(f"the {field} holds {characters} characters: past the model's context of {capacity} "
                           f"tokens of at most {longest_token} characters each", field)


def parse_request(body: dict, prompt: list[int], chat: bool, *, name: str, capacity: int,
                  stop_tokens: tuple[int, ...]) -> Asked:
    """What the request asks for, or a RequestError (400) naming the field: every field checked, the
    prompt against the context, the sampling fields against their ranges."""
    for field, value in body.items():
        if field in READ_FIELDS or field in NO_EFFECT_FIELDS or value is None:
            continue
        accepted = ONLY_AT_FIELDS.get(field)
        if accepted is None:
            raise RequestError(f"'{field}' is not supported by this server", field)
        if not any(type(value) is type(a) and value == a for a in accepted):
            raise RequestError(f"'{field}' = {value!r:.80} is not supported by this server (only "
                               f"{' or '.join(map(repr, accepted))})", field)
    model = body.get("model")
    if model not in (None, name):
        raise RequestError(f"model {model!r} is not served here; this server serves {name!r}", "model")
    room = capacity - len(prompt)
    if room <= 0:
        raise RequestError(f"the prompt is {len(prompt)} tokens; the model's context holds {capacity}",
                           "messages" if "messages" in body else "prompt")
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = number_field(body, limit_name, None, int)
    if max_tokens is not None and max_tokens < 0:
        raise RequestError(f"'{limit_name}' must be >= 0, got {max_tokens}", limit_name)
    if max_tokens is not None and max_tokens > room:
        raise RequestError(f"the prompt is {len(prompt)} tokens and {limit_name} {max_tokens}: together past the "
                           f"model's context of {capacity} tokens", limit_name)
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop)) or \
            len(stop) > STOP_STRINGS_MAX or any(len(s) > STOP_CHARS_MAX for s in stop):
        raise RequestError(f"'stop' must be a string or up to {STOP_STRINGS_MAX} strings of up to "
                           f"{STOP_CHARS_MAX} characters", "stop")
    options = {name: number_field(body, name, None, kind) for name, kind in SAMPLING_FIELDS.items()}
    options["temperature"] = 1.0 if options["temperature"] is None else options["temperature"]  # OpenAI's default
    try:
        sampling = Sampling(max_new_tokens=room if max_tokens is None else max_tokens,
                            stop_tokens=stop_tokens,
                            **{name: value for name, value in options.items() if value is not None})
    except ValueError as error:  # Sampling's messages start with the field's name
        field = str(error).split()[0]
        raise RequestError(str(error), field if field in SAMPLING_FIELDS else None) from error
    return Asked(prompt, sampling, tuple(stop), logprobs_asked(body, chat))



def logprobs_asked(body: dict, chat: bool) -> int | None:
    """Alternatives per token the reply's log-probabilities carry (None: none asked for): chat's
    `logprobs` (true) and `top_logprobs` (0 to 20); /v1/completions' legacy integer is refused."""
    wants = body.get("logprobs")
    if not chat:
        if wants is not None:
            raise RequestError("'logprobs' is not supported on /v1/completions (/v1/chat/completions gives them)",
                               "logprobs")
        if body.get("top_logprobs") is not None:
            raise RequestError("'top_logprobs' is a chat completion field", "top_logprobs")
        return None
    if wants is not None and not isinstance(wants, bool):
        raise RequestError(f"'logprobs' must be true or false, got {wants!r:.40}", "logprobs")
    top = number_field(body, "top_logprobs", None, int)
    if top is not None and not 0 <= top <= LOGPROBS_MAX:
        raise RequestError(f"'top_logprobs' must be in [0, {LOGPROBS_MAX}], got {top}", "top_logprobs")
    if top is not None and not wants:
        raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wants else None
