"""Decode steps at one context in a process of its own, for bench_e2e's peak memory.

    python -m benchmarks.decode_once KIND FOLDER CONTEXT [--capacity C] [--threads N] [--steps S]
                                     [--prompt-step P]

Opens the model (KIND one of bench_e2e.KINDS), allocates its caches at C positions, fills them
synthetically to CONTEXT - P tokens (bench_e2e.fill), runs the last P tokens as one exact prompt
step (what the runtime's prefill runs last: its logits for the last position only) and decodes S
tokens at CONTEXT. Prints one JSON line: the median ms per token, the peak RSS of the whole run
(VmHWM: loading, filling, the prompt step and decoding), the peak RSS of the prompt step and the
peak while decoding (VmHWM reset through /proc/self/clear_refs once the caches are filled, and again
after the prompt step: what a prefilling and a decoding app hold, without the synthetic fill's
temporaries), the prompt step's seconds and the caches' bytes, all in GiB (2**30 bytes, as
prefill_once reports).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import numpy as np
from quest_ort.runtime.generate import PREFILL_CHUNK

from .bench_e2e import KINDS, fill, open_model
from .prefill_once import peak_rss_gb


def reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("context", type=int)
    parser.add_argument("--capacity", type=int, default=None, help="cache positions (default: context + 64)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompt-step", type=int, default=PREFILL_CHUNK,
                        help="tokens of the exact prompt step that ends at CONTEXT (default: the runtime's "
                             "prefill chunk; 0: none)")
    args = parser.parse_args(argv)
    model = open_model(args.kind, args.folder, args.threads)
    cache = model.new_cache(1, args.capacity or args.context + 64)
    rng = np.random.default_rng(0)
    fill(cache, args.context - args.prompt_step, model.sidecar.settings.block_size, rng)
    loaded_gb = peak_rss_gb()
    prompt = {}
    if args.prompt_step:
        reset_peak_rss()
        ids = rng.integers(0, model.sidecar.vocab_size, (1, args.prompt_step))
        begin = time.perf_counter()
        model.step(cache, ids, exact=True, last_logits=1)
        prompt = {"prompt_step_seconds": round(time.perf_counter() - begin, 2),
                  "prompt_step_peak_rss_gb": round(peak_rss_gb(), 2)}
    reset_peak_rss()
    token, times = np.array([[7]], np.int64), []
    for _ in range(args.steps + 1):
        cache.lengths[:] = args.context
        begin = time.perf_counter()
        model.step(cache, token)
        times.append(time.perf_counter() - begin)
    cache_gb = sum(array.nbytes for array in cache.buffers.values()) / 2**30
    decoding_gb = peak_rss_gb()
    print(json.dumps({"ms_per_token": round(statistics.median(times[1:]) * 1e3, 2),
                      "peak_rss_gb": round(max(loaded_gb, decoding_gb, prompt.get("prompt_step_peak_rss_gb", 0)), 2),
                      **prompt, "decode_peak_rss_gb": round(decoding_gb, 2), "cache_gb": round(cache_gb, 2)}))


if __name__ == "__main__":
    main()
