"""Side-by-side generation: the same prompts through two runners (Quest and a dense baseline), one call."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from .generate import Generator, Sampling


@dataclasses.dataclass
class Run:
    tokens: list[list[int]]
    prefill_seconds: float
    decode_seconds: float
    decoded: int  # tokens generated after the first, summed over rows

    @property
    def tokens_per_second(self) -> float:
        return self.decoded / self.decode_seconds if self.decode_seconds > 0 else float("inf")


def timed_generation(model, prompts: Sequence[Sequence[int]], sampling: Sampling, capacity: int | None = None,
                     prefill: str = "exact") -> Run:
    """Generate, timing the prefill (to the first token) and the decode steps separately."""
    generator = Generator(model, capacity, prefill=prefill)
    rows: list[list[int]] = [[] for _ in prompts]
    begin = time.perf_counter()
    first = None
    for step in generator.stream(prompts, sampling):
        if first is None:
            first = time.perf_counter()
        for row, token in enumerate(step):
            if token is not None:
                rows[row].append(token)
    end = time.perf_counter()
    first = first or end
    decoded = sum(max(len(r) - 1, 0) for r in rows)
    return Run(rows, first - begin, end - first, decoded)


@dataclasses.dataclass
class Comparison:
    sparse: Run
    dense: Run

    @property
    def identical(self) -> bool:
        return self.sparse.tokens == self.dense.tokens

    @property
    def matching_fraction(self) -> float:
        pairs = [(a, b) for x, y in zip(self.sparse.tokens, self.dense.tokens) for a, b in zip(x, y)]
        return sum(a == b for a, b in pairs) / max(len(pairs), 1)

    @property
    def speedup(self) -> float:
        return self.sparse.tokens_per_second / self.dense.tokens_per_second


def compare(sparse_model, dense_model, prompts: Sequence[Sequence[int]], sampling: Sampling = Sampling(),
            capacity: int | None = None, prefill: str = "exact") -> Comparison:
    """Run the prompts through both models with the same sampling (and seed); `prefill` is the
    sparse model's prefill mode (the dense one always attends exactly)."""
    return Comparison(timed_generation(sparse_model, prompts, sampling, capacity, prefill),
                      timed_generation(dense_model, prompts, sampling, capacity))
