"""Shared pieces of the benchmarks: cold-cache timing, the read-bandwidth probe, ORT's GQA baseline."""

from __future__ import annotations

import ctypes
import statistics
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from quest_ort.graphs.op_graphs import elem_type
from quest_ort.ops import get_library_path

LAST_LEVEL_CACHE = 32 * 1024 * 1024
COLD_WORKING_SET = 4 * LAST_LEVEL_CACHE  # rotate among enough buffer copies to exceed the caches


def blocks_per_kv_head(selected: np.ndarray, kv_heads: int) -> list[np.ndarray]:
    """The distinct blocks each KV head reads from one query's block_indices rows [R, K]: its row,
    or (R = H, a list per query head) the union of its query heads' rows."""
    return [np.unique(rows[rows >= 0]) for rows in np.asarray(selected).reshape(kv_heads, -1)]


def copies_for(bytes_per_copy: int, most: int = 16) -> int:
    """How many copies of a call's buffers to rotate so each call reads from memory, not cache."""
    return int(min(most, max(2, -(-COLD_WORKING_SET // max(bytes_per_copy, 1)))))


def time_rotating(run, copies: int, budget_s: float = 0.6, least: int = 5, most: int = 200) -> float:
    """Median milliseconds of run(copy) over rotating copies, after one warm-up pass over them."""
    for copy in range(copies):
        run(copy)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < least or (time.perf_counter() - started < budget_s and len(times) < most):
        copy = len(times) % copies
        begin = time.perf_counter()
        run(copy)
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


def read_bandwidth(threads: int, gigabytes: float = 1.0, repeats: int = 5) -> float:
    """GB/s of a streaming read of `gigabytes` split across `threads`, with the kernels' instruction set."""
    library = ctypes.CDLL(get_library_path())
    library.QuestOrtReadProbe.restype = ctypes.c_float
    library.QuestOrtReadProbe.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    data = np.ones(int(gigabytes * 2**30) // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=library.QuestOrtReadProbe, args=(p.ctypes.data, p.size)) for p in parts]
        begin = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = min(best, time.perf_counter() - begin)
    return data.nbytes / best / 1e9


def pyplot(drawing: str):
    """matplotlib's pyplot (headless) to draw `drawing` (its file names), or None, saying so, where
    matplotlib is not installed: a benchmark writes its JSON, which holds every figure, before its
    plot (the make targets that run benchmarks install matplotlib; a venv made for the tests has none)."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: {drawing} not drawn (the JSON holds every figure)", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gqa_decode_model(num_heads: int, kv_num_heads: int, head_dim: int, capacity: int, dtype,
                     int8_kv: bool = False, query_len: int = 1) -> onnx.ModelProto:
    """ONNX Runtime's com.microsoft.GroupQueryAttention for `query_len` tokens (one decode token by
    default, a prompt step with more) over a [B,N,C,D] cache whose present outputs are bound to the
    past inputs (past_present_share_buffer).

    `int8_kv`: its int8 KV cache (ONNX Runtime >= 1.32 on CPU): k_quant_type / v_quant_type
    PER_CHANNEL, kv_cache_bit_width 8, and float32 scales [N, 1, D] as inputs k_scale and v_scale
    (indices 12 and 13; 7-11 are cos/sin caches, position ids, attention bias and head sink)."""
    H, N, D, C = num_heads, kv_num_heads, head_dim, capacity
    t = elem_type(dtype)
    kv = onnx.TensorProto.INT8 if int8_kv else t
    inputs = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    attributes = dict(num_heads=H, kv_num_heads=N)
    scales = []
    if int8_kv:
        inputs += [""] * 5 + ["k_scale", "v_scale"]
        attributes.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        scales = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [N, 1, D]) for name in ("k_scale", "v_scale")]
    node = helper.make_node("GroupQueryAttention", inputs, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node], "gqa_decode",
        [helper.make_tensor_value_info("query", t, ["B", query_len, H * D]),
         helper.make_tensor_value_info("key", t, ["B", query_len, N * D]),
         helper.make_tensor_value_info("value", t, ["B", query_len, N * D]),
         helper.make_tensor_value_info("past_key", kv, ["B", N, C, D]),
         helper.make_tensor_value_info("past_value", kv, ["B", N, C, D]),
         helper.make_tensor_value_info("seqlens_k", onnx.TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("total_sequence_length", onnx.TensorProto.INT32, [])] + scales,
        [helper.make_tensor_value_info("output", t, ["B", query_len, H * D]),
         helper.make_tensor_value_info("present_key", kv, ["B", N, C, D]),
         helper.make_tensor_value_info("present_value", kv, ["B", N, C, D])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def plain_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
