"""An export's peak memory at a long capacity: the mask probes at the capacity's end (one per layer) free what they ran on, so the peak does not grow with the layer count."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from support.export_models import tiny_model

TESTS = pathlib.Path(__file__).resolve().parents[1]
LONG = 1 << 21  # capacity: each probe feeds two float32 caches of this many rows

# One export in a process of its own; prints its peak RSS (MiB).
SCRIPT = """
import json, resource, sys, tempfile, pathlib
from quest_ort.pipeline import export_sparse
from quest_ort.export.rewrite import SparseSettings
with tempfile.TemporaryDirectory() as folder:
    export_sparse("qwen3", output=pathlib.Path(folder) / "m", settings=SparseSettings(top_k=2, block_size=16),
                  model=sys.argv[1], capacity=int(sys.argv[2]), log=lambda *a, **k: None)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
"""


def _peak_mib(checkpoint: pathlib.Path, capacity: int) -> int:
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(checkpoint), str(capacity)], capture_output=True,
                         text=True, cwd=TESTS)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_probes_memory_does_not_add_up_over_the_layers():
    model = tiny_model("qwen3")
    config = json.loads((model.checkpoint / "config.json").read_text())
    layers, heads, head_dim = config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]
    assert layers >= 3
    one_probe = 2 * heads * head_dim * 4 * LONG / 2**20  # MiB: a past key and a present key, float32
    grown = _peak_mib(model.checkpoint, LONG) - _peak_mib(model.checkpoint, 4096)
    # held over the layers, the growth would be about `layers` probes (measured 1610 MiB with 3 layers
    # before the probe sessions ran without ORT's arena; 570 after)
    assert grown < 2 * one_probe, (grown, one_probe, layers)
