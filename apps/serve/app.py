"""The server of `quest-ort serve`: slots that run requests, the FastAPI app, and `serve`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import pathlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request  # the serve extra (pyproject.toml); module level: FastAPI resolves the
from fastapi.openapi.utils import get_openapi  # handlers' annotations in this module
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ...runtime.chat import TextGenerator, TextStream
from ...runtime.generate import GeneratorBusyError
from ...runtime.slots import SlotFileError, TokenLogprob
from . import schema
from .metrics import Metrics
from .openai_format import error_body, logprob_content, timings_body, usage_body
from .requests import BODY_BYTES_MAX, Asked, RequestError, chat_messages, check_text_length, parse_request

log = logging.getLogger("quest_ort.serve")

DEFAULT_QUEUE = 64  # requests that may wait for a slot (--queue); past them a 503 with Retry-After
RETRY_AFTER_S = 1


# How often a non-streaming request checks that its client is still there.
DISCONNECT_POLL_S = 0.25


class Progress:
    """A prefill step done: `done` of `total` prompt tokens (what the cache did not hold) fed."""

    def __init__(self, done: int, total: int):
        self.done, self.total = done, total


class Delta:
    """Reply text as it comes, with the log-probabilities of the tokens it adds (when asked for)."""

    def __init__(self, text: str, logprobs: list[TokenLogprob]):
        self.text, self.logprobs = text, logprobs


class Job:
    """One checked request (what it asks for: requests.Asked), how to cancel it, and how far its
    prefill went."""

    def __init__(self, asked: Asked):
        self.prompt, self.sampling, self.stop, self.logprobs = asked.prompt, asked.sampling, asked.stop, asked.logprobs
        self.cancelled = threading.Event()
        self.stream: TextStream | None = None
        self.prefill: Progress | None = None  # None until its first prefill step ends

    def cancel(self) -> None:
        self.cancelled.set()
        if self.stream is not None:
            self.stream.cancel()


class QueueFullError(RuntimeError):
    """Every slot runs a request and the queue holds as many as it may (HTTP 503, Retry-After)."""


class Server:
    """The model, its TextGenerator of N slots and N worker threads, one per running request (each
    reads its stream; whichever holds the slots' lock runs the round that advances them all)."""

    def __init__(self, generator: TextGenerator, name: str, queue: int = DEFAULT_QUEUE):
        self.generator, self.name = generator, name
        self.slots = len(generator.slots.slots)
        self.queue = queue  # requests that may wait for a slot
        self.metrics = Metrics(self)
        self.created = int(time.time())
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=self.slots,
                                                             thread_name_prefix="quest-ort-serve")
        self._lock = threading.Lock()
        self.queued = 0  # requests accepted and not finished (running or waiting)
        self.running: list[Job] = []  # in the order they started

    def run(self, job: Job, emit: Callable[[Delta | Progress], None]) -> TextStream | None:
        """Runs `job` on the worker thread (queued behind earlier ones), calling emit(Delta) per
        delta, and emit(Progress) after each prefill step; the finished TextStream, or None when
        cancelled before it started."""
        if job.cancelled.is_set():
            return None
        with self._lock:
            self.running.append(job)

        def prefilled(done: int, total: int) -> None:
            job.prefill = Progress(done, total)
            emit(job.prefill)

        try:
            job.stream = self.generator.complete(job.prompt, job.sampling, stop=job.stop, on_prefill=prefilled,
                                                 logprobs=job.logprobs)
            if job.cancelled.is_set():
                job.stream.cancel()
            sent = 0  # the stream's logprobs given out with earlier deltas
            with job.stream:
                for text in job.stream:  # each delta with the logprobs of the tokens it adds
                    emit(Delta(text, job.stream.logprobs[sent : job.stream.logprobs_given]))
                    sent = job.stream.logprobs_given
            if sent < len(job.stream.logprobs):  # tokens whose text was held back, then cut by a stop string
                emit(Delta("", job.stream.logprobs[sent:]))
            self.metrics.finished(job.stream)
            return job.stream
        finally:
            with self._lock:
                self.running.remove(job)

    @property
    def busy(self) -> int:
        """Slots running a request."""
        return len(self.running)

    def prefill_progress(self) -> dict | None:
        """How far the prefill of the earliest running request still prefilling went: {"done", "total"}
        tokens, or None."""
        with self._lock:
            for job in self.running:
                progress = job.prefill
                if progress is not None and progress.done < progress.total:
                    return {"done": progress.done, "total": progress.total}
        return None

    def check_room(self) -> None:
        """QueueFullError when every slot is busy and the queue is full: checked before a response
        starts (a stream's 200 goes out before its job is submitted)."""
        with self._lock:
            if self.queued >= self.slots + self.queue:
                raise QueueFullError(f"all {self.slots} slots are busy and {self.queue} requests wait; try again")

    async def submit(self, job: Job, emit: Callable[[Delta | Progress], None]) -> TextStream | None:
        """Runs the job in a slot, waiting in the queue for one."""
        with self._lock:
            self.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, self.run, job, emit)
        finally:
            with self._lock:
                self.queued -= 1

    def close(self) -> None:
        """Refuse what is queued and stop the running requests before their next token."""
        self._worker.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            running = list(self.running)
        for job in running:
            job.cancel()


def create_app(generator: TextGenerator, name: str, queue: int = DEFAULT_QUEUE, slot_save_path=None):
    """The FastAPI app serving `generator`'s model as `name`: as many requests at once as it has
    slots, up to `queue` more waiting; slots saved to and restored from files in `slot_save_path`
    (None: off)."""
    server = Server(generator, name, queue)
    save_dir = None if slot_save_path is None else pathlib.Path(slot_save_path)
    longest_token = generator.tokenizer.longest_token_characters()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.close()

    app = FastAPI(title="quest-ort", lifespan=lifespan)
    app.state.server = server

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = schema.with_request_schemas(
                get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, error: QueueFullError):
        log.info("refused: %s", error)
        server.metrics.queue_full.inc()
        return JSONResponse(error_body(str(error), kind="server_busy"), status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError):
        log.info("refused: %s", error)
        server.metrics.refused.inc()
        return JSONResponse(error_body(str(error), error.param, error.kind), status_code=error.status)

    async def read_body(request: Request) -> dict:
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > BODY_BYTES_MAX:
                raise RequestError(f"the body is past {BODY_BYTES_MAX >> 20} MiB", kind="too_large")
        try:
            body = json.loads(bytes(data))
        except ValueError as error:
            raise RequestError(f"the body is not JSON: {error}") from error
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    @app.get("/health")
    async def health():
        # pid: which process answered, when replicas (apps/replicas.py) share one address
        return {"status": "ok", "model": name, "busy": server.busy > 0, "slots": server.slots,
                "slots_busy": server.busy, "queued": server.queued,
                "prefill": server.prefill_progress(), "prefill_mode": generator.prefill,
                "context_used": generator.context_used, "capacity": generator.capacity, "pid": os.getpid()}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/slots")
    async def slots():
        return [{"id": slot.row, "tokens": len(slot.cached), "reusable": slot.reusable, "busy": slot.busy}
                for slot in generator.slots.slots]

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: int, action: str, request: Request):
        """llama.cpp's slot endpoints: ?action=save or restore, body {"filename": NAME} (a plain file
        name inside --slot-save-path)."""
        if save_dir is None:
            raise RequestError("saving slots is off: start the server with --slot-save-path DIR", "action")
        if action not in ("save", "restore"):
            raise RequestError(f"action must be 'save' or 'restore', got {action!r:.40}", "action")
        if not 0 <= slot_id < server.slots:
            raise RequestError(f"slot {slot_id} does not exist: this server has {server.slots}", "id_slot")
        filename = (await read_body(request)).get("filename")
        if not isinstance(filename, str) or not filename or filename in (".", "..") or \
                pathlib.PurePath(filename).name != filename or "\\" in filename:
            raise RequestError("'filename' must be a plain file name (no folder)", "filename")
        path = save_dir / filename
        if action == "restore" and not path.is_file():
            return JSONResponse(error_body(f"no slot file {filename!r}", "filename", "not_found"), status_code=404)
        began = time.perf_counter()
        try:
            if action == "save":
                count = await asyncio.to_thread(generator.save_slot, slot_id, path)
            else:
                count = await asyncio.to_thread(generator.restore_slot, slot_id, path)
        except GeneratorBusyError as error:
            return JSONResponse(error_body(str(error), "id_slot", "slot_busy"), status_code=409)
        except SlotFileError as error:
            raise RequestError(str(error), "filename") from error
        milliseconds = (time.perf_counter() - began) * 1e3
        done = {"save": ("n_saved", "save_ms"), "restore": ("n_restored", "restore_ms")}[action]
        return {"id_slot": slot_id, "filename": filename, done[0]: count, "timings": {done[1]: milliseconds}}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": server.created,
                                            "owned_by": "quest-ort"}]}

    @app.post("/v1/chat/completions", **schema.documented(schema.ChatCompletionRequest, schema.ChatCompletion))
    async def chat_completions(request: Request):
        body = await read_body(request)
        checked = chat_messages(body)
        check_text_length(sum(len(m["content"]) for m in checked), generator.capacity, longest_token, "messages")
        try:
            prompt = generator.tokenizer.encode_chat(checked)
        except Exception as error:  # the template's own raise_exception (a role it does not take...)
            raise RequestError(f"the chat template refused the messages: {error}", "messages") from error
        return await respond(request, body, prompt, chat=True)

    @app.post("/v1/completions", **schema.documented(schema.CompletionRequest, schema.Completion))
    async def completions(request: Request):
        body = await read_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            check_text_length(len(prompt), generator.capacity, longest_token, "prompt")
            ids = generator.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):  # ints, not bools
            ids = prompt
            if max(ids) >= generator.model.vocab_size or min(ids) < 0:
                raise RequestError(f"prompt token ids must lie in [0, {generator.model.vocab_size})", "prompt")
        else:
            raise RequestError("'prompt' must be a string (or one string, or token ids)", "prompt")
        if not ids:
            raise RequestError("the prompt encodes to no tokens", "prompt")
        return await respond(request, body, ids, chat=False)

    async def respond(request: Request, body: dict, prompt: list[int], chat: bool):
        job = Job(parse_request(body, prompt, chat, name=name, capacity=generator.capacity,
                                stop_tokens=generator.stop_tokens))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be true or false", "stream")
        server.check_room()
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if not stream:
            result = await until_disconnected(request, job, server.submit(job, lambda item: None))
            if result is None or result.finish_reason == "cancelled":  # nobody is left to answer
                return JSONResponse(error_body("the client disconnected", kind="cancelled"), status_code=499)
            choice = {"index": 0, "finish_reason": result.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": result.text}
                choice["logprobs"] = None if job.logprobs is None else {
                    "content": logprob_content(generator.tokenizer, result.logprobs)}
            else:
                choice.update(text=result.text, logprobs=None)
            log_request(ident, result)
            return {"id": ident, "object": kind, "created": created, "model": name, "choices": [choice],
                    "usage": usage_body(result), "timings": timings_body(result)}
        options = body.get("stream_options") or {}
        if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
            raise RequestError(f"'stream_options' takes only include_usage, got {options!r:.80}", "stream_options")
        include_usage = bool(options.get("include_usage"))
        return StreamingResponse(events(job, ident, created, chat, include_usage), media_type="text/event-stream")

    def log_request(ident: str, result: TextStream) -> None:
        """One structured line per answered request (JSON after the message: a log reader parses it)."""
        u = result.usage
        log.info("request %s", json.dumps({
            "id": ident, "finish_reason": result.finish_reason, "prompt_tokens": u.prompt_tokens,
            "cached_tokens": u.reused_tokens, "completion_tokens": u.completion_tokens,
            "prefill_s": round(u.prefill_seconds, 4), "decode_s": round(u.decode_seconds, 4)}))

    async def until_disconnected(request: Request, job: Job, work):
        """`work`'s result, cancelling the job should the client go away first (a non-streaming
        client that gave up must not keep the worker generating for nobody)."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                job.cancel()
                log.info("client disconnected, generation cancelled")
        return task.result()

    async def events(job: Job, ident: str, created: int, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict | None = None, text: str | None = None, finish: str | None = None,
                  usage: dict | None = None, logprobs: list[TokenLogprob] | None = None,
                  timings: dict | None = None) -> str:
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = delta or {}
                if job.logprobs is not None:
                    choice["logprobs"] = {"content": logprob_content(generator.tokenizer, logprobs or [])}
            else:
                choice.update(text=text or "", logprobs=None)
            event = {"id": ident, "object": kind, "created": created, "model": name,
                     "choices": [] if usage is not None else [choice]}
            if usage is not None:
                event["usage"] = usage
            if timings is not None:
                event["timings"] = timings
            return f"data: {json.dumps(event)}\n\n"

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        task = asyncio.ensure_future(server.submit(job, lambda delta: loop.call_soon_threadsafe(queue.put_nowait,
                                                                                                delta)))
        task.add_done_callback(lambda _: queue.put_nowait(done))
        try:
            if chat:
                yield chunk(delta={"role": "assistant", "content": ""})
            while (item := await queue.get()) is not done:
                if isinstance(item, Progress):  # an SSE comment: clients skip it, a reader sees the prefill
                    yield f": prefill {item.done}/{item.total}\n\n"
                else:
                    yield chunk(delta={"content": item.text}, text=item.text, logprobs=item.logprobs)
            try:
                result = task.result()
            except Exception as error:  # a failed step: said in the stream, as OpenAI does, then ended
                log.exception("%s: generation failed", ident)
                yield f"data: {json.dumps(error_body(f'generation failed: {error}', kind='server_error'))}\n\n"
                return
            log_request(ident, result)
            yield chunk(delta={}, finish=result.finish_reason, timings=timings_body(result))
            if include_usage:
                yield chunk(usage=usage_body(result))
            yield "data: [DONE]\n\n"
        finally:  # the client went away (or the stream failed): stop generating before the next token
            if not task.done():
                job.cancel()
                log.info("%s: client disconnected, generation cancelled", ident)

    return app


DEFAULT_PARALLEL_MOST = 4  # --parallel's default at most: on a few cores more rows add little to a step's output


def default_parallel(model, capacity: int) -> int:
    """--parallel's default: the slots whose caches (each of `capacity` tokens) fit in half the memory
    available now, at most DEFAULT_PARALLEL_MOST, at least 1."""
    from ...model_folder.cache import cache_bytes

    per_slot = cache_bytes(model.sidecar, 1, capacity)
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return max(1, min(DEFAULT_PARALLEL_MOST, int(available // 2 // max(1, per_slot))))


def serve(folder, *, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, threads: int | None = None,
          prefill: str = "exact", log_level: str = "info", parallel: int | None = None,
          queue: int = DEFAULT_QUEUE, slot_save_path=None) -> None:
    """Load the folder and serve it until interrupted; `prefill`: how prompts are prefilled
    ("exact", "sparse", "per-token": runtime/generate.py); `parallel` slots (default_parallel when
    None), `queue` requests waiting for one."""
    import uvicorn

    from ...runtime.model import QuestModel

    folder = pathlib.Path(folder)
    model = QuestModel(folder, threads=threads)
    slots = default_parallel(model, model.capacity) if parallel is None else parallel
    generator = TextGenerator(model, prefill=prefill, slots=slots)
    if slot_save_path is not None:
        pathlib.Path(slot_save_path).mkdir(parents=True, exist_ok=True)
    app = create_app(generator, name or folder.resolve().name, queue, slot_save_path)
    log.info("serving %s as %r on http://%s:%d/v1 (capacity %d tokens, %s prefill; %d slot(s), %d more may wait)",
             folder, app.state.server.name, host, port, generator.capacity, generator.prefill, slots, queue)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
