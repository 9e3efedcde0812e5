"""The Ascend (CANN) path, as far as it can be checked without an NPU.

The AscendC kernels and the CANN custom-op library are not built here (no CANN toolkit; see
docs/cann.md). What is checked: the host tiling plans, executed exactly by the CPU emulator
(build/driver-native/quest_cann_emulator) on the conformance cases, for several NPU sizes, down to
a unified buffer so small that every call is cut into many chunks and the candidates spill to the
GM workspace: QuestMetadata and SparseBlockSelect equal the reference bit for bit; the FIA block
table of SparseBlockAttention attends exactly the selected tokens. Calls the NPU path refuses
are refused with the reason, and the CMake option fails clearly without a toolkit.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

from quest_ort.ops.reference import sparse_block_select
from support.cases import CASES, with_specials
from support.driver_cases import OUTPUTS, read_output, total_lens, write_case
from support.driver_cases import expected as reference_outputs
from support.tolerances import assert_close, assert_equal, assert_used_blocks_equal

REPO = pathlib.Path(__file__).resolve().parents[2]
# QUEST_ORT_CANN_EMULATOR points at another build (make test-sanitize: the ASan+UBSan one).
EMULATOR = pathlib.Path(os.environ.get("QUEST_ORT_CANN_EMULATOR", REPO / "build" / "driver-native" / "quest_cann_emulator"))
# (vector cores, UB bytes): Ascend 910B; a 910B4-like part; one core with a tiny UB (many chunks,
# candidates in the GM workspace).
NPUS = {"910B": (48, 192 * 1024), "40-cores": (40, 192 * 1024), "1-core-16KB": (1, 16 * 1024)}
# The NPU kernels take float bounds only: int8 bounds are refused (tested below), and so are chunk
# queries (a sparse prefill).
BOUND_CASES = [case for case in CASES if case.score == "bound" and not case.int8_bounds and case.chunk == "none"]
# The NPU kernels take float caches only: next to int8 caches QuestMetadata is refused (tested below).
METADATA_CASES = [case for case in BOUND_CASES if not case.int8]
# The selections the NPU kernel implements: the bound score, one selection per KV head.
NPU_SELECT_CASES = [case for case in BOUND_CASES if case.reduce != "none"]


def _npu_options(npu, overrides) -> dict:
    """The emulator's NPU description: the named NPU's cores and UB, with `overrides` on top."""
    cores, ub = NPUS[npu]
    return dict(npu_cores=cores, npu_ub_bytes=ub) | overrides


def _emulate(directory, op_name, inputs, attributes, case, npu, **overrides) -> subprocess.CompletedProcess:
    if not EMULATOR.is_file():
        pytest.fail(f"{EMULATOR} is missing: build it with `make drivers` (make test does)")
    write_case(directory, op_name, inputs, attributes, case, total_lens(inputs, case), **_npu_options(npu, overrides))
    return subprocess.run([str(EMULATOR), str(directory)], capture_output=True, text=True, timeout=600)


def _plan(run) -> dict:
    assert run.returncode == 0, run.stdout + run.stderr
    words = run.stdout.split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2) if re.fullmatch(r"-?\d+", words[i + 1])}


def _emulated_plan(directory, op_name, case, npu, inputs_of=None, **overrides):
    """Runs `op_name` on `case` (its inputs changed by `inputs_of`, if given) in the emulator of
    `npu` (see _npu_options); checks the plan stays within the NPU's cores and UB; returns (plan,
    the inputs, the reference outputs)."""
    inputs, attributes, expected = reference_outputs(op_name, case, inputs_of)
    plan = _plan(_emulate(directory, op_name, inputs, attributes, case, npu, **overrides))
    options = _npu_options(npu, overrides)
    assert plan["cores"] <= options["npu_cores"] and plan["ub_used"] <= options["npu_ub_bytes"]
    return plan, inputs, expected


@pytest.mark.parametrize("npu", list(NPUS))
@pytest.mark.parametrize("case", METADATA_CASES, ids=lambda case: case.id)
def test_metadata_plan_matches_the_reference(case, npu, tmp_path):
    _, inputs, expected = _emulated_plan(tmp_path, "QuestMetadata", case, npu)
    for name, want in zip(OUTPUTS["QuestMetadata"], expected):
        assert_used_blocks_equal(read_output(tmp_path, "cann", name, want), want, total_lens(inputs, case),
                                 case.block_size, f"{npu} {name}")


@pytest.mark.parametrize("npu", list(NPUS))
@pytest.mark.parametrize("case", NPU_SELECT_CASES, ids=lambda case: case.id)
def test_select_plan_matches_the_reference(case, npu, tmp_path):
    plan, _, expected = _emulated_plan(tmp_path, "SparseBlockSelect", case, npu)
    if npu == "1-core-16KB" and case.num_blocks() > 16:
        assert plan["blocks_per_chunk"] < case.num_blocks(), "the tiny UB should cut the blocks into chunks"
    assert_equal(read_output(tmp_path, "cann", "block_indices", expected[0]), expected[0], f"{npu} block_indices")


@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect"])
@pytest.mark.parametrize("case", [c for c in NPU_SELECT_CASES if c.ranks_blocks() and not c.int8][:4],
                         ids=lambda case: case.id)
def test_plans_on_non_finite_numbers_match_the_reference(case, op_name, tmp_path):
    """NaN of either sign, infinities, subnormals and float16 overflow (docs/ops.md, non-finite
    numbers): the emulated NPU kernels' bounds and selections equal the reference bit for bit."""
    _, inputs, expected = _emulated_plan(tmp_path, op_name, case, "1-core-16KB", with_specials)
    for name, want in zip(OUTPUTS[op_name], expected):
        got = read_output(tmp_path, "cann", name, want)
        if op_name == "QuestMetadata":
            assert_used_blocks_equal(got, want, total_lens(inputs, case), case.block_size, name)
        else:
            assert_equal(got, want, name)


@pytest.mark.parametrize("case", [c for c in NPU_SELECT_CASES if c.ranks_blocks()][:6], ids=lambda case: case.id)
def test_candidates_kept_in_the_gm_workspace_select_the_same(case, tmp_path):
    plan, _, expected = _emulated_plan(tmp_path, "SparseBlockSelect", case, "910B", npu_cores=5,
                                       npu_candidate_ub_divisor=2**40)
    assert plan["candidates_in_ub"] == 0
    assert_equal(read_output(tmp_path, "cann", "block_indices", expected[0]), expected[0], "block_indices")


def _paged(inputs, block_size):
    """The caches grown to a whole number of pages (the NPU path reads them as [B*N*M, P, D])."""
    capacity = inputs["key_cache"].shape[2]
    pad = -capacity % block_size
    grown = {name: np.pad(inputs[name], [(0, 0), (0, 0), (0, pad), (0, 0)]) for name in ("key_cache", "value_cache")}
    return {**inputs, **grown}


FIA_CASES = [case for case in CASES if case.dtypes == ("float16", "float16") and case.reduce != "none" and case.chunk == "none"]


@pytest.mark.parametrize("case", FIA_CASES, ids=lambda case: case.id)
def test_fia_block_table_attends_exactly_the_selected_tokens(case, tmp_path):
    inputs, attributes, expected = reference_outputs("SparseBlockAttention", case,
                                                     lambda x: _paged(x, case.block_size))
    _plan(_emulate(tmp_path, "SparseBlockAttention", inputs, attributes, case, "910B"))
    names = OUTPUTS["SparseBlockAttention"][:3]
    got = {name: read_output(tmp_path, "cann", name, want) for name, want in zip(names, expected)}
    assert_close(got["output"], expected[0], np.float16, "output")
    assert_equal(got["key_cache_out"], expected[1], "key_cache_out")
    assert_equal(got["value_cache_out"], expected[2], "value_cache_out")


def test_some_conformance_cases_reach_the_fia_emulation():
    assert FIA_CASES, "no float16/float16 conformance case reaches the FIA emulation"


@pytest.mark.parametrize("what, change, words", [
    ("float32 caches", dict(dtypes=("float32", "float32")), "float32 caches are not supported"),
    ("mixed dtypes", dict(dtypes=("float16", "float32")), "share one element type"),
    ("capacity not a multiple of P", dict(pad=False), "must be a multiple of block_size"),
])
def test_calls_the_npu_attention_refuses_say_why(what, change, words, tmp_path):
    import dataclasses

    case = dataclasses.replace(FIA_CASES[0], **{k: v for k, v in change.items() if k != "pad"})
    inputs, attributes, _ = reference_outputs("SparseBlockAttention", case)
    if change.get("pad", True):
        inputs = _paged(inputs, case.block_size)
    elif inputs["key_cache"].shape[2] % case.block_size == 0:
        pytest.fail("the case's capacity is already a multiple of P; pick another")
    run = _emulate(tmp_path, "SparseBlockAttention", inputs, attributes, case, "910B")
    assert run.returncode == 3 and words in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("policy, words", [
    (dict(score="probe"), "score='probe' has no NPU kernel"),
    (dict(reduce="none", score="bound"), "group_reduce='none' has no NPU kernel"),
])
def test_selections_without_an_npu_kernel_say_so(policy, words, tmp_path):
    case = next(case for case in CASES if all(getattr(case, k) == v for k, v in policy.items()))
    inputs, attributes, _ = reference_outputs("SparseBlockSelect", case)
    run = _emulate(tmp_path, "SparseBlockSelect", inputs, attributes, case, "910B")
    assert run.returncode == 3 and words in run.stdout and "function-body export" in run.stdout


@pytest.mark.parametrize("op_name, words", [
    ("QuestMetadata", "key_cache_type 'int8' is not supported on CANN"),
    ("SparseBlockAttention", "int8 caches have no NPU kernel"),
])
def test_int8_caches_have_no_npu_kernel_and_say_so(op_name, words, tmp_path):
    """As the CANN op library: its QuestMetadata refuses key_cache_type 'int8', and int8 attention
    is left to the CPU op (docs/ops.md, int8 caches)."""
    case = next(case for case in CASES if case.int8)
    inputs, attributes, _ = reference_outputs(op_name, case)
    run = _emulate(tmp_path, op_name, inputs, attributes, case, "910B")
    assert run.returncode == 3 and words in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("op_name", ["QuestMetadata", "SparseBlockSelect"])
def test_int8_bounds_have_no_npu_kernel_and_say_so(op_name, tmp_path):
    """As the CANN op library: its metadata and select kernels take float bounds only (docs/ops.md,
    int8 block bounds); int8 bounds are refused with the reason, never read as float16."""
    case = next(case for case in NPU_SELECT_CASES if not case.int8)
    B, (H, N), S, D, M = case.batch, case.heads, case.new_tokens, case.head_dim, case.num_blocks()
    rng = np.random.default_rng(0)
    bounds = dict(block_max=np.ones((B, N, M, D), np.int8), block_min=-np.ones((B, N, M, D), np.int8),
                  block_exponent=np.zeros((B, N, M), np.int8), past_lens=case.past_lens(), total_lens=case.total_lens())
    activation = case.dtypes[0]
    if op_name == "QuestMetadata":
        inputs = dict(key=rng.standard_normal((B, N, S, D)).astype(activation), **bounds)
        attributes = dict(block_size=case.block_size)
    else:
        inputs = dict(query=rng.standard_normal((B, H, S, D)).astype(activation), **bounds)
        attributes = dict(num_heads=H, kv_num_heads=N, block_size=case.block_size, top_k=case.k())
    run = _emulate(tmp_path, op_name, inputs, attributes, case, "910B")
    assert run.returncode == 3 and "int8 block bounds are not supported on CANN" in run.stdout, run.stdout + run.stderr


def test_attention_with_a_block_list_per_query_head_has_no_npu_kernel_and_says_so(tmp_path):
    case = next(case for case in CASES if case.reduce == "none" and case.dtypes == ("float16", "float16")
                 and case.heads[0] != case.heads[1])
    inputs, attributes, _ = reference_outputs("SparseBlockAttention", case, lambda x: _paged(x, case.block_size))
    run = _emulate(tmp_path, "SparseBlockAttention", inputs, attributes, case, "910B")
    assert run.returncode == 3 and "a row per query head" in run.stdout, run.stdout + run.stderr


def test_the_cann_build_option_fails_clearly_without_a_toolkit(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([str(REPO / ".venv" / "bin" / "cmake"), "-S", str(REPO), "-B", str(tmp_path / "build"),
                          "-DQUEST_ORT_CANN=ON", "-DASCEND_CANN_PACKAGE_PATH=" + str(tmp_path / "no-cann")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode != 0
    assert "QUEST_ORT_CANN=ON needs the Ascend CANN toolkit" in run.stdout + run.stderr


CSRC = REPO / "ops" / "csrc"
SELECT_ITEM = CSRC / "cann" / "kernels" / "select_item.h"
SELECT_RULE = CSRC / "kernels" / "select_rule.h"
NPU_SELECT_KERNEL = CSRC / "cann" / "kernels" / "sparse_block_select_npu.cpp"


@pytest.mark.parametrize("user", [NPU_SELECT_KERNEL, CSRC / "cann" / "emulator" / "emulated_kernels.cc"],
                         ids=lambda path: path.name)
def test_the_npu_select_kernel_and_the_emulator_run_one_per_item_selection(user):
    """The AscendC source is not compiled here: the emulator checks its selection only because both
    run the same code, select_item.h's (the rule of kernels/select_rule.h), with no rule of their own."""
    source = user.read_text()
    assert re.search(r'#include "(\.\./kernels/)?select_item\.h"', source)
    assert re.search(r"\bselect_item\(", source), "the items are not selected by select_item.h"
    for own_rule in ("ranks_before", "BestList", "importance_quota", "take_forced", "sink_blocks", "recent_blocks"):
        assert own_rule not in source, f"{user.name} spells out its own {own_rule}"


def test_the_shared_selection_builds_as_device_code(tmp_path):
    """select_item.h and select_rule.h as the AscendC compiler gets them (__aicore__ functions):
    C++17, nothing of the C++ library but <cstdint>, every template instantiated."""
    (tmp_path / "cstdint").write_text("#include <stdint.h>\n")
    unit = tmp_path / "device.cc"
    unit.write_text(f'''#include "{SELECT_ITEM}"
template <class V> struct Array {{
  V* data;
  V get(int64_t i) const {{ return data[i]; }}
  void set(int64_t i, V v) {{ data[i] = v; }}
}};
struct Core {{
  int32_t out[64], chosen[64];
  float values[64];
  int64_t past_len(int64_t) const {{ return 0; }}
  int64_t total_len(int64_t) const {{ return 1; }}
  void set_index(int64_t at, int32_t block) {{ out[at] = block; }}
  Array<int32_t> chosen_blocks() {{ return {{chosen}}; }}
  Array<float> importance_chunk(int64_t, int64_t, int64_t) {{ return {{values}}; }}
  void load_query(int64_t, int64_t, int64_t) {{}}
  Array<float> score_chunk(int64_t, int64_t, int64_t, int) {{ return {{values}}; }}
}};
void select(Core& core, const quest::cann::SelectPlan& plan, Array<float> scores, Array<int32_t> blocks) {{
  quest::cann::select_item(core, plan, 0, scores, blocks);
}}
''')
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}  # make test-sanitize's libasan
    run = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-nostdinc++",
                          "-isystem", str(tmp_path), "-D__CCE_KT_TEST__", "-D__aicore__=", str(unit)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr


def test_a_portable_export_runs_without_the_library_and_matches_the_native_ops(tmp_path):
    """export-sparse --portable: standard ops only, every one on the CANN graph-mode list, run in a
    plain ONNX Runtime session (no op library), the same greedy tokens and close logits as the
    native Quest model, sparse selection included."""
    import onnx

    from support.export_models import quest_export, tiny_model
    from quest_ort.pipeline import export_sparse
    from quest_ort.export.rewrite import SparseSettings
    from quest_ort.graphs.portable import ops_outside_cann_graph_mode
    from quest_ort.runtime.generate import greedy
    from quest_ort.runtime.model import QuestModel

    settings = SparseSettings(top_k=3, block_size=16, group_reduce="none", dense_layers=(0,), kv_dtype="float16",
                              portable=True)
    export_sparse("qwen3", output=tmp_path / "portable", settings=settings, model=str(tiny_model("qwen3").checkpoint),
                  capacity=512, log=lambda *a, **k: None)
    graph = onnx.load(str(tmp_path / "portable" / "model.quest.onnx"), load_external_data=False)
    assert ops_outside_cann_graph_mode(graph) == []
    assert all(opset.domain in ("", "ai.onnx") for opset in graph.opset_import)
    portable = QuestModel(tmp_path / "portable", threads=1)
    assert portable.sidecar.settings.portable
    native = QuestModel(quest_export("qwen3", top_k=3, kv_dtype="float16", group_reduce="none"), threads=1)
    prompt = np.random.default_rng(3).integers(0, 256, 90).tolist()  # 6 blocks: the budget of 3 selects
    tokens, logits = greedy(portable, [prompt], 8, return_logits=True)
    want_tokens, want_logits = greedy(native, [prompt], 8, return_logits=True)
    assert tokens == want_tokens
    for step, (got, want) in enumerate(zip(logits, want_logits)):
        assert_close(got, want, np.float16, f"portable logits, step {step}")


@pytest.mark.parametrize("op_name", ["SparseBlockSelect", "SparseBlockAttention"])
def test_chunk_queries_have_no_npu_kernel_and_say_so(op_name, tmp_path):
    """As the CANN op library: a call with chunk queries (a sparse prefill, docs/ops.md) is refused
    with the reason, never run as per-token or exact queries."""
    case = next(case for case in CASES if case.chunk != "none" and case.reduce != "none" and not case.int8
                and not case.int8_bounds and case.exact != "all")
    inputs, attributes, _ = reference_outputs(op_name, case, None if op_name == "SparseBlockSelect"
                                              else lambda x: _paged(x, case.block_size))
    run = _emulate(tmp_path, op_name, inputs, attributes, case, "910B")
    assert run.returncode == 3 and "chunk queries (chunk_lens, a sparse prefill) have no NPU kernel" in run.stdout, \
        run.stdout + run.stderr


def test_a_select_without_chunk_queries_lists_no_chunk_on_the_npu(tmp_path):
    """chunk_lens at past_lens (no chunk query, as a decode step of an export with sparse prefill feeds
    it): the NPU select runs, and the chunks' rows are all -1."""
    import dataclasses

    case = next(case for case in NPU_SELECT_CASES if not case.int8)
    inputs, attributes, expected = reference_outputs("SparseBlockSelect", case)
    inputs = dict(inputs, chunk_lens=inputs["past_lens"])
    chunked = dataclasses.replace(case, chunk="all")  # the case folder's chunk fields (Q, KC)
    expected = sparse_block_select(**inputs, **attributes, **chunked.chunk_attributes())
    run = _emulate(tmp_path, "SparseBlockSelect", inputs, attributes, chunked, "910B")
    assert run.returncode == 0, run.stdout + run.stderr
    assert_equal(read_output(tmp_path, "cann", "block_indices", expected[0]), expected[0], "block_indices")
    chunks = read_output(tmp_path, "cann", "chunk_indices", expected[1])
    assert (chunks == -1).all() and (expected[1] == -1).all()
