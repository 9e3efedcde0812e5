"""The wheel's promises: the op library needs no libpython (so the py3-none tag holds), and under `make test-wheel`
the tests import quest_ort from the manylinux wheel installed for this architecture (a venv on x86_64, a --target
folder under qemu on aarch64), not from the checkout, and its kernels are this machine's best.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import subprocess

import pytest

import quest_ort

# make test-wheel sets it to the folder it installed the wheel into (a venv's site-packages, or pip's --target);
# elsewhere the wheel's checks are skipped.
WHEEL_SITE = os.environ.get("QUEST_ORT_WHEEL_SITE")
from_the_wheel = pytest.mark.skipif(not WHEEL_SITE, reason="only under `make test-wheel` (QUEST_ORT_WHEEL_SITE)")


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils)")
def test_the_op_library_needs_no_libpython():
    """pyproject.toml's wheel.py-api = "py3" tags the wheel for every CPython: true while the library
    links no libpython (ONNX Runtime loads it through its C API). (readelf reads the libraries it names of any
    architecture, the aarch64 wheel's under qemu too.)"""
    dynamic = subprocess.run(["readelf", "-d", quest_ort.get_library_path()], capture_output=True, text=True,
                             check=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not any("libpython" in line for line in needed), dynamic


@from_the_wheel
def test_quest_ort_and_its_library_come_from_the_wheel():
    site = pathlib.Path(WHEEL_SITE).resolve() / "quest_ort"
    import quest_ort.ops
    import quest_ort.runtime.single_op  # what the conformance suite runs the ops through

    for where in (quest_ort.__file__, quest_ort.ops.__file__, quest_ort.runtime.single_op.__file__,
                  quest_ort.get_library_path()):
        assert pathlib.Path(where).resolve().is_relative_to(site), f"{where} is not in the wheel's install {site}"


@from_the_wheel
def test_the_wheel_runs_this_machines_kernels():
    """The wheel is built for a baseline CPU; the kernels it picks at run time are this one's best SIMD variant
    (every x86_64 machine this runs on has AVX2; every aarch64 one has NEON)."""
    from quest_ort.ops import native_kernel_isa, native_supported_isas

    isa = native_kernel_isa()
    assert isa == native_supported_isas()[0], (isa, native_supported_isas())
    expected = {"aarch64": ("neon",), "x86_64": ("avx2", "avx512", "avx512vnni")}[platform.machine()]
    assert isa in expected, f"{platform.machine()}: the wheel's library runs {isa!r} kernels"


@from_the_wheel
@pytest.mark.skipif(not os.environ.get("QUEST_ORT_WHEEL_ORT"), reason="make test-wheel's run on an older onnxruntime")
def test_the_run_is_on_the_onnxruntime_asked_for():
    import onnxruntime

    assert onnxruntime.__version__ == os.environ["QUEST_ORT_WHEEL_ORT"]


@from_the_wheel
def test_the_installed_distribution_is_the_manylinux_wheel():
    distribution = importlib.metadata.distribution("quest-ort")
    # pip records where it installed from: a wheel file, not a folder (pip install . or -e .).
    origin = json.loads(distribution.read_text("direct_url.json") or "{}")
    assert origin.get("url", "").endswith(".whl") and "dir_info" not in origin, origin
    tags = [line.split(":", 1)[1].strip() for line in distribution.read_text("WHEEL").splitlines()
            if line.startswith("Tag:")]
    manylinux = [tag for tag in tags if tag.startswith("py3-none-manylinux_") and tag.endswith(platform.machine())]
    assert tags and manylinux == tags, tags
