"""`make bench-wheel`: the op library users install from the x86_64 wheel (zig's clang and libc++, built for a
baseline CPU: `make wheel`) against the one `make install` builds (GCC), side by side on the default decode step
(the three ops as one layer, H=32 N=8 D=128 at 32K cached tokens; float16 and int8 caches; 1 and 2 threads).
Both libraries choose the same kernel variant at run time (QUEST_ORT_ISA picks one for both). `speedup` is the
GCC build's median time over the wheel's: above 1, the wheel is faster. Prints and writes
benchmarks/results/wheel_build[_<isa>].json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import tempfile
import zipfile

import numpy as np
import onnxruntime as ort

from quest_ort.ops import get_library_path, native_kernel_isa
from quest_ort.runtime import sessions

from .bench_ops import RESULTS, SETTINGS, Config, bench_config, paired_speedups

HEADS, CONTEXT = (32, 8, 128), 32768


@contextlib.contextmanager
def sessions_register(library: str):
    """Sessions made inside register `library` instead of the package's own."""
    saved = sessions.get_library_path
    sessions.get_library_path = lambda: library
    try:
        yield
    finally:
        sessions.get_library_path = saved


def wheel_library(wheel: pathlib.Path, folder: pathlib.Path) -> str:
    """The op library inside `wheel`, extracted into `folder`."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.extract("quest_ort/ops/libquest_ort_ops.so", folder)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=pathlib.Path, default=None, help="default: the x86_64 wheel in dist/")
    parser.add_argument("--output", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    wheels = [args.wheel] if args.wheel else sorted(pathlib.Path("dist").glob("*_x86_64.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"bench_wheel_build: one x86_64 wheel expected (make wheel), found {wheels or 'none'}")
    isa = native_kernel_isa()
    print(f"kernels: {isa}; onnxruntime {ort.__version__}; {platform.processor() or platform.machine()}")
    print(f"GCC build: {get_library_path()}\nwheel: {wheels[0]}")
    default = SETTINGS[0]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        wheel_lib = wheel_library(wheels[0], pathlib.Path(folder))
        for dtype in ("float16", "int8"):
            cfg = Config(*HEADS, CONTEXT, dtype, np.random.default_rng(0))
            for threads in (1, 2):
                print(f"H={HEADS[0]} N={HEADS[1]} D={HEADS[2]} C={CONTEXT} {dtype}, {threads} thread(s): GCC build",
                      flush=True)
                gcc_run = bench_config(cfg, default, threads, np.random.default_rng(1), [])
                print("  wheel build", flush=True)
                with sessions_register(wheel_lib):
                    wheel_run = bench_config(cfg, default, threads, np.random.default_rng(1), [])
                paired_speedups(wheel_run, {"gcc_build": gcc_run}, cfg.copies, rows, heads="/".join(map(str, HEADS)),
                                context=CONTEXT, dtype=dtype, threads=threads, isa=isa)
            del cfg
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / ("wheel_build.json" if "QUEST_ORT_ISA" not in os.environ else f"wheel_build_{isa}.json")
    path.write_text(json.dumps(dict(machine=dict(processor=platform.processor(), cpus=os.cpu_count(), isa=isa,
                                                 onnxruntime=ort.__version__),
                                    wheel=wheels[0].name, rows=rows), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
