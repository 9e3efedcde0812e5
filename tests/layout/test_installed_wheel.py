"""The wheel's promises: the op library needs no libpython (so the py3-none tag holds), and under `make test-wheel`
the tests import quest_ort from the manylinux wheel installed in build/wheel-venv, not from the checkout.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import sysconfig

import pytest

import quest_ort

# make test-wheel sets it to the venv it installed the wheel into; elsewhere the wheel's checks are skipped.
WHEEL_VENV = os.environ.get("QUEST_ORT_WHEEL_VENV")
from_the_wheel = pytest.mark.skipif(not WHEEL_VENV, reason="only under `make test-wheel` (QUEST_ORT_WHEEL_VENV)")


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd")
def test_the_op_library_needs_no_libpython():
    """pyproject.toml's wheel.py-api = "py3" tags the wheel for every CPython: true while the library
    links no libpython (ONNX Runtime loads it through its C API)."""
    needed = subprocess.run(["ldd", quest_ort.get_library_path()], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed, needed


@from_the_wheel
def test_quest_ort_and_its_library_come_from_the_wheel_venv():
    venv = pathlib.Path(WHEEL_VENV).resolve()
    assert pathlib.Path(sys.prefix).resolve() == venv, f"the tests run in {sys.prefix}, not in {venv}"
    site = pathlib.Path(sysconfig.get_paths()["platlib"]).resolve() / "quest_ort"
    import quest_ort.ops
    import quest_ort.runtime.single_op  # what the conformance suite runs the ops through

    for where in (quest_ort.__file__, quest_ort.ops.__file__, quest_ort.runtime.single_op.__file__,
                  quest_ort.get_library_path()):
        assert pathlib.Path(where).resolve().is_relative_to(site), f"{where} is not in the wheel's install {site}"


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
