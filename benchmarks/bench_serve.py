"""`make bench-serve`: `quest-ort serve` under several streaming `openai` clients at once, as users run it.

SmolLM2-135M-Instruct's default export (`export-sparse llama --k 32`, capacity 4096: bench_text's
folder) served by `quest-ort serve --parallel 8` in a process of its own; each client sends a chat
prompt of about 2000 tokens of its own (no shared prefix) and streams a greedy reply of up to
MAX_TOKENS tokens, with logprobs (each chunk then says how many tokens it carries). Measured:

- 1, 2, 4 and 8 clients at once: each client's time to its first token and to its reply's end;
  the aggregate decode rate, tokens per second over the window where every client decodes (after
  the last first token, before the first reply ends; the whole run's tokens over its span too);
- the same 4 clients on `--parallel 1` (requests queued, one at a time), for comparison;
- prefix reuse: a conversation's first token cold, then resent with its reply (of 64, then 128
  tokens) and one more turn after another client's request (the first token's time, and the
  cached tokens usage reports);
- what sharing a batch changes: the same request alone (on the --parallel 1 server) and among 4
  (on the --parallel 8 one): whether the text matches and the largest logprob difference.

Prints a summary and writes benchmarks/results/serve.json and serve.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from .bench_text import ensure_folder
from .harness import pyplot

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MAX_TOKENS = 128
CLIENTS = (1, 2, 4, 8)
REUSE_REPLY_TOKENS = (64, 128)  # the resent conversation's reply, prefilled again with the new turn
PARALLEL = 8


def prompt(label: str) -> list[dict]:
    """About 2000 tokens, beginning with `label` (prompts of different labels share no prefix)."""
    lines = " ".join(f"Line {i}: the {label} dragon drank tea number {i * 7 % 13} by the river." for i in range(118))
    return [{"role": "user", "content": f"{label}. {lines} Now write a long story about this dragon, in three "
                                        "paragraphs."}]


@contextlib.contextmanager
def serving(folder: pathlib.Path, parallel: int, threads: int):
    """`quest-ort serve folder --parallel N` in its own process; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "quest_ort.apps.cli", "serve", str(folder), "--port", str(port), "--parallel",
               str(parallel), "--threads", str(threads), "--name", "bench", "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"quest-ort serve exited: {process.stderr.read()[-2000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("quest-ort serve did not start in 300 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(60)


def client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1200)


def stream_reply(url: str, messages: list[dict], started: float, max_tokens: int = MAX_TOKENS) -> dict:
    """One streamed greedy reply: when each chunk came (seconds from `started`) and how many tokens it
    carried, its text, logprobs and usage."""
    stamps, counts, text, logprobs, usage = [], [], [], [], None
    sent = time.perf_counter() - started
    for chunk in client(url).chat.completions.create(
            model="bench", messages=messages, max_tokens=max_tokens, temperature=0, stream=True, logprobs=True,
            stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            entries = chunk.choices[0].logprobs.content
            stamps.append(time.perf_counter() - started)
            counts.append(len(entries))
            logprobs += [entry.logprob for entry in entries]
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
    return {"sent": sent, "stamps": stamps, "counts": counts, "text": "".join(text), "logprobs": logprobs,
            "completion_tokens": usage.completion_tokens, "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "prompt_tokens": usage.prompt_tokens}


def at_once(url: str, labels: list[str]) -> list[dict]:
    """Every label's prompt from a client of its own, all sent at once."""
    started, results = time.perf_counter(), {}
    threads = [threading.Thread(target=lambda l=label: results.__setitem__(l, stream_reply(url, prompt(l), started)))
               for label in labels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[label] for label in labels]


def round_summary(replies: list[dict]) -> dict:
    firsts = [r["stamps"][0] for r in replies]
    ends = [r["stamps"][-1] for r in replies]
    window = (max(firsts), min(ends))
    in_window = sum(c for r in replies for s, c in zip(r["stamps"], r["counts"]) if window[0] < s <= window[1])
    tokens = sum(r["completion_tokens"] for r in replies)
    return {"clients": len(replies),
            "first_token_s": [round(t, 3) for t in firsts], "end_s": [round(t, 3) for t in ends],
            "completion_tokens": [r["completion_tokens"] for r in replies],
            "decode_window_s": round(window[1] - window[0], 3),
            "decode_tokens_per_s": round(in_window / (window[1] - window[0]), 2) if window[1] > window[0] else None,
            "run_tokens_per_s": round(tokens / (max(ends) - min(firsts)), 2),
            "last_first_token_before_first_end": max(firsts) < min(ends)}


def prefix_reuse(url: str, reply_tokens: int) -> dict:
    """A conversation cold (a reply of up to `reply_tokens`), another client's request, then the
    conversation with its reply and one more turn: the reply is prefilled again (sparse decode steps
    computed its keys), so the resent prompt's own work grows with it."""
    messages = prompt(f"conversation {reply_tokens}")
    cold = stream_reply(url, messages, time.perf_counter(), reply_tokens)
    stream_reply(url, prompt("interloper"), time.perf_counter())
    resent = [*messages, {"role": "assistant", "content": cold["text"]}, {"role": "user", "content": "Continue."}]
    warm = stream_reply(url, resent, time.perf_counter(), reply_tokens)
    cold_s, warm_s = cold["stamps"][0] - cold["sent"], warm["stamps"][0] - warm["sent"]
    return {"cold_first_token_s": round(cold_s, 3), "resent_first_token_s": round(warm_s, 3),
            "speedup": round(cold_s / warm_s, 1), "resent_prompt_tokens": warm["prompt_tokens"],
            "resent_cached_tokens": warm["cached_tokens"]}


def plot(report: dict, path: pathlib.Path) -> bool:
    plt = pyplot(path.name)
    if plt is None:
        return False

    rounds = report["rounds"]
    figure, (rate, first) = plt.subplots(1, 2, figsize=(10, 4))
    rate.bar([str(r["clients"]) for r in rounds], [r["decode_tokens_per_s"] or 0 for r in rounds], color="tab:blue")
    rate.set(xlabel="concurrent clients", ylabel="aggregate decode tokens/s",
             title=f"--parallel {PARALLEL}: decode of all clients at once")
    for r in rounds:
        first.plot(range(1, r["clients"] + 1), sorted(r["first_token_s"]), marker="o", label=f"{r['clients']} clients")
    queued = report["queued_4_clients"]
    first.plot(range(1, 5), sorted(queued["first_token_s"]), marker="x", linestyle="--", label="4, --parallel 1")
    first.set(xlabel="client (by first token)", ylabel="seconds to first token", title="time to first token")
    first.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS / "serve.json")
    args = parser.parse_args(argv)
    folder = ensure_folder()
    report = {"folder": folder.name, "threads": args.threads, "parallel": PARALLEL, "max_tokens": MAX_TOKENS,
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
              "date": time.strftime("%Y-%m-%d"), "rounds": []}
    with serving(folder, 1, args.threads) as url:
        alone = stream_reply(url, prompt("client 0 of 4"), time.perf_counter())
        queued = at_once(url, [f"queued {i} of 4" for i in range(4)])
        report["queued_4_clients"] = round_summary(queued)
        print(f"--parallel 1, 4 clients: {report['queued_4_clients']}", flush=True)
    with serving(folder, PARALLEL, args.threads) as url:
        for count in CLIENTS:
            replies = at_once(url, [f"client {i} of {count}" for i in range(count)])
            report["rounds"].append(round_summary(replies))
            print(f"--parallel {PARALLEL}, {count} clients: {report['rounds'][-1]}", flush=True)
            if count == 4:
                batched = replies[0]
                report["batch_effect"] = {
                    "same_text": batched["text"] == alone["text"],
                    "compared_tokens": min(len(batched["logprobs"]), len(alone["logprobs"])),
                    "max_logprob_difference": max((abs(a - b) for a, b in zip(batched["logprobs"], alone["logprobs"])),
                                                  default=0.0)}
                print(f"the same request alone and among 4: {report['batch_effect']}", flush=True)
        report["prefix_reuse"] = {str(tokens): prefix_reuse(url, tokens) for tokens in REUSE_REPLY_TOKENS}
        print(f"prefix reuse: {report['prefix_reuse']}", flush=True)
    one = report["rounds"][0]["decode_tokens_per_s"]
    four = next(r for r in report["rounds"] if r["clients"] == 4)
    report["summary"] = {
        "decode_4_clients_over_1": round(four["decode_tokens_per_s"] / one, 2) if one and four["decode_tokens_per_s"] else None,
        "fourth_first_token_before_first_end": four["last_first_token_before_first_end"],
        "prefix_reuse_speedup": {tokens: reuse["speedup"] for tokens, reuse in report["prefix_reuse"].items()}}
    print(json.dumps(report["summary"]), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    drawn = plot(report, args.output.with_suffix(".png"))
    print(f"wrote {args.output}" + (f" and {args.output.with_suffix('.png')}" if drawn else ""))


if __name__ == "__main__":
    main()
