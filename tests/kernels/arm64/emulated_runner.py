"""Runs inside the emulated AArch64 Python (make test-arm64): every `*.in.npz` call in a folder
through the aarch64 ONNX Runtime with the aarch64 op library; writes `*.out.npz` and report.json.

Kept to ONNX Runtime and NumPy: the reference outputs are computed natively by the host test.
"""

from __future__ import annotations

import json
import pathlib
import platform
import sys

import numpy as np
import onnxruntime as ort

from quest_ort.ops import get_library_path, native_kernel_isa
from quest_ort.runtime.single_op import run_op


def main(folder: pathlib.Path) -> None:
    ort.set_default_logger_severity(3)
    calls = sorted(folder.glob("*.in.npz"))
    for index, path in enumerate(calls):
        data = np.load(path)
        meta = json.loads(str(data["__meta__"]))
        inputs = {name: data[name] for name in data.files if name != "__meta__"}
        outputs = run_op(meta["op"], inputs, meta["attributes"], outputs=tuple(meta["outputs"]),
                         threads=meta["threads"])
        np.savez(path.with_name(path.name.replace(".in.npz", ".out.npz")), **outputs)
        print(f"{index + 1}/{len(calls)} {path.name}", flush=True)
    report = dict(machine=platform.machine(), onnxruntime=ort.__version__, numpy=np.__version__,
                  isa=native_kernel_isa(), library=get_library_path(), calls=len(calls))
    (folder / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
