"""make bench-wheel's plumbing: the wheel's library is the one extracted from the wheel, and sessions made inside
sessions_register load that library and no other (then the package's own again)."""

from __future__ import annotations

import zipfile

import onnxruntime as ort
import pytest

from benchmarks.bench_wheel_build import sessions_register, wheel_library
from quest_ort.ops import get_library_path
from quest_ort.runtime import sessions


def test_the_library_comes_out_of_the_wheel(tmp_path):
    wheel = tmp_path / "quest_ort-0.1.0-py3-none-manylinux_2_24_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("quest_ort/ops/libquest_ort_ops.so", b"the wheel's library")
        archive.writestr("quest_ort/__init__.py", "")
    extracted = wheel_library(wheel, tmp_path / "out")
    assert open(extracted, "rb").read() == b"the wheel's library"


def test_sessions_inside_register_the_library_given_and_the_packages_after(tmp_path):
    missing = tmp_path / "not_there.so"
    with sessions_register(str(missing)):
        with pytest.raises(Exception, match="not_there.so"):
            sessions.session_options()
    assert isinstance(sessions.session_options(), ort.SessionOptions)
    assert sessions.get_library_path() == get_library_path()
