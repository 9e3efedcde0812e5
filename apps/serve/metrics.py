"""`quest-ort serve`'s Prometheus metrics (GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ...runtime.chat import TextStream


class Metrics:
    """The server's Prometheus metrics (GET /metrics), in a registry of its own."""

    def __init__(self, server):
        """`server`: what the gauges read (its `busy`, `queued` and `slots`)."""
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("quest_ort_requests", "requests answered, by how they ended", ["finish_reason"],
                                registry=registry)
        self.refused = Counter("quest_ort_requests_refused", "requests refused before they queued (400, 413)",
                               registry=registry)
        self.prompt_tokens = Counter("quest_ort_prompt_tokens", "prompt tokens of answered requests",
                                     registry=registry)
        self.cached_tokens = Counter("quest_ort_prompt_cached_tokens",
                                     "prompt tokens the cache already held (prefix-cache hits)", registry=registry)
        self.generated_tokens = Counter("quest_ort_generated_tokens", "tokens generated", registry=registry)
        self.prefill_seconds = Counter("quest_ort_prefill_seconds", "seconds in prefill steps", registry=registry)
        self.decode_seconds = Counter("quest_ort_decode_seconds", "seconds in decode steps and sampling",
                                      registry=registry)
        waiting = Gauge("quest_ort_requests_waiting", "requests queued behind the running one", registry=registry)
        waiting.set_function(lambda: max(0, server.queued - server.busy))
        busy = Gauge("quest_ort_slots_busy", "slots running a request", registry=registry)
        busy.set_function(lambda: server.busy)
        Gauge("quest_ort_slots", "slots (requests run at once)", registry=registry).set(server.slots)
        self.queue_full = Counter("quest_ort_requests_queue_full", "requests refused with a 503: the queue was full",
                                  registry=registry)

    def finished(self, stream: TextStream) -> None:
        u = stream.usage
        self.requests.labels(stream.finish_reason or "cancelled").inc()
        self.prompt_tokens.inc(u.prompt_tokens)
        self.cached_tokens.inc(u.reused_tokens)
        self.generated_tokens.inc(u.completion_tokens)
        self.prefill_seconds.inc(u.prefill_seconds)
        self.decode_seconds.inc(u.decode_seconds)
