"""`quest-ort serve`: an OpenAI-compatible HTTP server over an exported folder (FastAPI on uvicorn).

    POST /v1/chat/completions   messages -> reply (the folder's chat template), streamed with `stream`
    POST /v1/completions        a text prompt -> its continuation
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok", "busy": ..., "slots": ..., "slots_busy": ..., "queued": ...,
                                 "prefill": ..., "pid": ...}
    GET  /metrics               Prometheus metrics: requests, tokens, prefill and decode seconds, queue
    GET  /slots                 the slots: tokens cached, reusable, busy
    POST /slots/ID?action=save  {"filename": NAME}: the slot's cache to --slot-save-path/NAME (restore: back)

Requests run in slots (`--parallel N`, runtime/slots.py): N rows of one cache, each running one
request, every decode step one batch of the running rows, and prompt chunks interleaved with those
steps; requests beyond N wait, first come first served, up to `--queue` of them (past that a 503
with `Retry-After`). A request goes to the free slot whose tokens share its longest prefix, so a
client that sends its conversation again with one more turn prefills only what the slot cannot
reuse: only what a fresh server would compute the same way (never a reply's sparse-decoded tokens),
so a request gets the same reply whatever ran before it. Each request is checked before it queues:
a prompt plus max_tokens past the capacity, a sampling field out of its range, or a field this
server does not implement (n > 1, echo, tools...), is a 400 in OpenAI's error format naming it;
every field is read, or changes nothing of the output (`user`, `metadata`, `store`), or is
refused: none is accepted and ignored. Sampling: `temperature`, `top_p`, `top_k`, `min_p`,
`presence_penalty`, `frequency_penalty`, `repetition_penalty`, `seed` (runtime/sampling.py says
how), `stop` (up to 4 strings of up to 256 characters); chat `logprobs` and `top_logprobs`. A
client that disconnects (streaming or not) stops its generation before the next token, and its
slot takes the next request.

A long prompt's prefill shows its progress: a streaming response sends an SSE comment line
`: prefill DONE/TOTAL` after each prefill step (clients skip comment lines; a raw reader sees the
first token coming), and `/health` gives a running request's `"prefill": {"done", "total"}`.
`quest-ort serve --prefill sparse` prefills prompts in chunks that select their blocks
(runtime/generate.py).
"""

from .app import DEFAULT_QUEUE, create_app, default_parallel, serve
from .requests import RequestError

__all__ = ["DEFAULT_QUEUE", "RequestError", "create_app", "default_parallel", "serve"]
