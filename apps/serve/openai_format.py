"""OpenAI's response shapes for `quest-ort serve`: error bodies, usage, llama.cpp's timings, chat
log-probabilities."""

from __future__ import annotations

from ...runtime.chat import TextStream
from ...runtime.slots import TokenLogprob


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def logprob_content(tokenizer, entries: list[TokenLogprob]) -> list[dict]:
    """OpenAI's chat `logprobs.content` for `entries`: each token's text, its UTF-8 bytes, logprob
    and top alternatives."""
    def described(token: int, logprob: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return [{**described(e.token, e.logprob), "top_logprobs": [described(t, lp) for t, lp in e.top]} for e in entries]


def usage_body(stream: TextStream) -> dict:
    u = stream.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.reused_tokens}}


def timings_body(stream: TextStream) -> dict:
    """The reply's timings as llama.cpp's server gives them (prompt: the tokens prefilled)."""
    u = stream.usage
    prompt_n, predicted_n = u.prompt_tokens - u.reused_tokens, u.completion_tokens
    prompt_ms, predicted_ms = u.prefill_seconds * 1e3, u.decode_seconds * 1e3

    def rates(n: int, ms: float) -> tuple[float | None, float | None]:
        return (ms / n if n else None), (n / ms * 1e3 if ms > 0 else None)

    (prompt_per_token, prompt_per_second), (predicted_per_token, predicted_per_second) = (
        rates(prompt_n, prompt_ms), rates(predicted_n, predicted_ms))
    return {"cache_n": u.reused_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_second,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms, "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": predicted_per_second}
