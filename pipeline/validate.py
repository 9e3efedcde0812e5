"""Numerical validation of a rewritten model against its source graph, before the export is placed.

The Quest graph is exact wherever its budget covers the context (every block is selected) and on
exact prefill; past the budget, selection is expected to change the logits. So the source and the
Quest graph are run on the same tokens, step by step:

- a prompt the budget covers, prefilled exactly, then decoded sparsely while the budget still
  covers the context: every step compared;
- the same prompt prefilled sparsely (each prompt token selects, all blocks fit): compared;
- a longer prompt, past the budget where the capacity allows: its exact prefill compared, then a
  few sparse decode steps that need only be finite (exactness is not expected there).

A folder with quantized weights (`export-sparse --weights int8|int4`) cannot be exact: on the same
comparisons its drift from the float source is measured as the relative logit error, and bounded
by WEIGHT_TOLERANCES (the float graph it was quantized from is validated as above first).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Iterator

import numpy as np

from ..export.rewrite import ExportError
from ..export.rewrite.layers import detect_kind, find_layers
from ..runtime.model import QuestModel
from ..runtime.sessions import NUMPY_TYPES

LONGEST_PROMPT = 512  # the longer prompt passes the budget by 8 tokens, up to this length
DECODE_STEPS = 8


class SourceRunner:
    """The source graph run one step at a time (batch 1), its caches fed back as the source's own
    runtime feeds them:

    ```
    optimum / opset-23 Attention:  past [1,N,L,D] --graph (Concat inside)--> present [1,N,L+S,D] -> next past
    GroupQueryAttention:           past [1,N,C,D] --GQA writes rows L..L+S-1--> present [1,N,C,D] -> next past
                                   attention_mask ones [1, L+S] -> seqlens_k = L+S-1, total = L+S
    ```
    GroupQueryAttention graphs run as onnxruntime-genai runs the builder's models (its
    `past_present_share_buffer`): one buffer of C rows per cache, the valid length told by the
    attention mask. The KV heads and head size come from `geometry` where the graph leaves them
    symbolic (the builder's `kv_cache_dim`)."""

    def __init__(self, path: pathlib.Path, geometry=None):
        import onnx_ir as ir
        import onnxruntime as ort

        graph = ir.load(path).graph
        kind = detect_kind(graph)
        slots = find_layers(graph, kind)
        self.shared_buffer = kind == "genai"
        # MatMulNBits with accuracy_level 4 quantizes its input rows to int8 (ONNX Runtime's
        # CompInt8): logits then move by whole quantization steps where inputs differ by rounding.
        self.int8_activations = any(node.op_type == "MatMulNBits" and node.attributes.get_int("accuracy_level", 0) == 4
                                    for node in graph)
        self.presents = {slot.present_key.name: slot.past_key.name for slot in slots}
        self.key_layers = {slot.past_key.name: slot.index for slot in slots}  # past key input -> layer
        self.presents.update({slot.present_value.name: slot.past_value.name for slot in slots})
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        known = {"input_ids", "attention_mask", "position_ids", *self.presents.values()}
        unknown = sorted(set(self.inputs) - known)
        if unknown:
            raise ExportError(f"validation cannot feed the source graph's inputs {unknown}")
        self.cache_dims = {}  # cache input -> (KV heads, head size)
        for name in self.presents.values():
            shape = self.inputs[name].shape
            dims = [shape[1] if isinstance(shape[1], int) else None, shape[3] if isinstance(shape[3], int) else None]
            if geometry is not None:
                dims = [dims[0] or geometry.kv_num_heads, dims[1] or geometry.head_dim]
            if None in dims:
                raise ExportError(f"validation cannot size the source graph's cache input {name!r} (shape {shape})")
            self.cache_dims[name] = tuple(dims)
        self.reset(0)

    def reset(self, capacity: int) -> None:
        """An empty cache; `capacity`: the tokens the run will hold (the shared buffers' rows)."""
        self.length = 0
        rows = capacity if self.shared_buffer else 0
        self.past = {name: np.zeros((1, heads, rows, head_dim), NUMPY_TYPES[self.inputs[name].type])
                     for name, (heads, head_dim) in self.cache_dims.items()}

    def step(self, ids: np.ndarray) -> np.ndarray:
        new = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, self.length + new)),
                 "position_ids": (self.length + np.arange(new))[None], **self.past}
        feeds = {name: np.asarray(value, NUMPY_TYPES[self.inputs[name].type]) for name, value in feeds.items()
                 if name in self.inputs}
        values = dict(zip(self.outputs, self.session.run(None, feeds)))
        for present, past in self.presents.items():
            self.past[past] = values[present]
        self.length += new
        return values["logits"]


def plan(covered: int, capacity: int) -> list[tuple[int, int, str]]:
    """(prompt tokens, decode steps, prefill mode) of each run; `covered` is the budget in tokens.
    Inside the budget a sparse prefill (chunks of queries) and a per-token one select every block:
    they must give the source's logits too."""
    short = max(min(covered, 32, capacity), 1)
    decode = min(DECODE_STEPS, short - 1)
    longer = max(min(max(24, covered + DECODE_STEPS), LONGEST_PROMPT, capacity - 4), 1)
    return [(short - decode, decode, "exact"), (short - decode, 0, "sparse"), (short - decode, 0, "per-token"),
            (longer, max(min(4, capacity - longer), 0), "exact")]


# Max |logit difference| from the source graph where the Quest graph must equal it, relative to the
# logits' scale (their largest magnitude, at least 1), by cache type where the caches hold the
# source's activation type: float32 caches differ by summation order only; float16 caches (of a
# float16 source) round as the source's own do.
LOGIT_TOLERANCE = {"float32": 1e-3, "float16": 2e-2}
# The same where the source's MatMulNBits quantize their inputs to int8 (accuracy_level 4, as
# onnxruntime-genai's builder writes int4 models): an input that differs from the source's by float
# rounding (the Quest ops sum in another order) can round to the next int8 step, and that step
# reaches the logits. Measured up to 0.033 of the logits' scale on the builder's random-weight test
# models (`make test-genai`) and 0.042 on SmolLM2-135M (`make test-genai-smollm2`); float activations
# with the same weights (accuracy_level 0 or 1) stay within 3e-6 and 1e-4 (SmolLM2).
INT8_ACTIVATION_TOLERANCE = 1e-1

# The largest relative logit error (LogitErrorSum) a folder with quantized weights may show against
# its float source on validate_export's comparisons. Measured with export/quantize.py's settings
# (docs/export.md): int8 0.016-0.025 on the families' default models, 0.039 on
# Qwen2.5-Coder-0.5B-Instruct, 0.13 on SmolLM2-135M-Instruct; int4 0.23-0.32, 0.47 and 0.93
# (SmolLM2's 30 narrow layers amplify the weights' rounding most). The bounds keep about twice the
# worst for int8 and a quarter more for int4, below the 1.41 of logits unrelated to the float ones.
WEIGHT_TOLERANCES = {"int8": 0.25, "int4": 1.2}
# Whatever the tolerances allow, logits that carry no information are refused: a relative error of
# about 1 is also what logits constant over the vocabulary give, so a drifted folder must keep
# this much of the source logits' spread and correlate with them at least this well (LogitErrorSum).
# Measured: SmolLM2-135M-Instruct in int4, the largest drift of a real model (0.897), keeps spread
# 1.04 and correlation 0.862; the tiny test models' int4 exports 0.99-1.0 and >= 0.979.
INFORMATIVE_SPREAD, INFORMATIVE_CORRELATION = 0.5, 0.5

# A cache narrower than the activations (float16 or int8 caches of a float32 source, int8 of a
# float16 one) rounds every key and value: the rewrite is validated exactly with caches of the
# activation type, then the narrow caches' own logit drift (LogitErrorSum, over the same comparisons)
# is bounded by these. A worst-case bound would not do: on one random prompt Qwen2.5-Coder-0.5B's
# logits move by 0.075 of their scale (1.27) with float16 caches, whose perplexity on text stays
# within 0.1% of float32's.
# Measured: float16 0.015 and int8 0.25 on Qwen2.5-Coder-0.5B-Instruct (0.46 with int8 keys not
# smoothed), on the families' default models and SmolLM2-135M see docs/export.md. Logits unrelated
# to the source's give about 1.4.
CACHE_TOLERANCES = {"float16": 0.1, "int8": 0.5}


class SourceLogits:
    """The source graph's logits for each token sequence asked for, run once: an export compares up
    to three folders with the source on the same tokens (the rewrite, its narrow caches' drift, its
    quantized weights' drift). The source's session opens when first needed; `release` closes it
    (the logits stay), so it is not held through the export's other steps."""

    def __init__(self, path: pathlib.Path, geometry=None):
        self.path, self.geometry = path, geometry
        self._runner: SourceRunner | None = None
        self._runs: dict[tuple, list[np.ndarray]] = {}

    @property
    def runner(self) -> SourceRunner:
        if self._runner is None:
            self._runner = SourceRunner(self.path, self.geometry)
        return self._runner

    def release(self) -> None:
        self._runner = None

    def of(self, steps: list[np.ndarray]) -> list[np.ndarray]:
        """The logits of each step of `steps` (token ids [1, S] each), fed from an empty cache."""
        key = tuple((ids.shape, ids.tobytes()) for ids in steps)
        if key not in self._runs:
            self.runner.reset(sum(ids.shape[1] for ids in steps))
            self._runs[key] = [self.runner.step(ids) for ids in steps]
        return self._runs[key]


def _comparisons(source: SourceLogits, quest: QuestModel) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(where, the Quest graph's logits, the source graph's) at every step where the budget covers
    the context, the plan's steps run on both graphs; raises ExportError on non-finite logits
    past the budget."""
    sidecar = quest.sidecar
    sparse = sidecar.settings.attention == "quest" and sidecar.sparse_layers
    capacity = sidecar.capacity
    covered = sidecar.settings.top_k * sidecar.settings.block_size if sparse else capacity
    rng = np.random.default_rng(0)
    for prompt, decode, mode in plan(covered, capacity):
        if mode == "sparse" and sidecar.prefill_problem(mode) is not None:
            continue  # (a graph from before sparse prefill: the runtime refuses the mode)
        cache = quest.new_cache(1, capacity=prompt + decode)
        steps = [rng.integers(0, sidecar.vocab_size, size=(1, prompt), dtype=np.int64)]
        steps += [rng.integers(0, sidecar.vocab_size, size=(1, 1), dtype=np.int64) for _ in range(decode)]
        for index, (ids, expected) in enumerate(zip(steps, source.of(steps))):
            first = index == 0
            got = quest.step(cache, ids, exact=first and mode == "exact", chunked=first and mode == "sparse")
            where = (f"the {mode} prefill of a {prompt}-token prompt" if first
                     else f"decode step {index} after a {prompt}-token prompt")
            if (first and mode == "exact") or int(cache.lengths[0]) <= covered:
                yield where, got, expected
            elif not np.isfinite(got).all():
                raise ExportError(f"validation failed: the Quest graph's logits are not finite at {where}")


def validate_export(source: SourceLogits, staged: pathlib.Path) -> float:
    """Max |logit difference| where the Quest graph must equal the source graph; raises ExportError
    on a mismatch there, or on non-finite logits past the budget. The folder's caches hold the
    source's activation type (narrower ones: validate_drift)."""
    quest = QuestModel(staged, threads=1)
    tolerance = LOGIT_TOLERANCE[quest.sidecar.settings.kv_dtype]
    if source.runner.int8_activations:
        tolerance = max(tolerance, INT8_ACTIVATION_TOLERANCE)
    worst = 0.0
    for where, got, expected in _comparisons(source, quest):
        difference = float(np.abs(got - expected).max())
        if not difference <= tolerance * max(float(np.abs(expected).max()), 1.0):
            raise ExportError(f"validation failed: the Quest graph's logits differ from the source graph's "
                              f"by {difference:.3g} at {where}, where the budget covers the context")
        worst = max(worst, difference)
    return worst


@dataclasses.dataclass(frozen=True)
class Drift:
    """How far a folder's quantized weights or narrow caches move the logits from its float source."""

    what: str  # "int8 weights", "int4 weights", "float16 caches", "int8 caches"
    relative_error: float  # relative_logit_error over every comparison
    tolerance: float
    max_abs_diff: float  # the largest |logit difference|, for scale
    spread_ratio: float  # LogitErrorSum.spread_ratio: how much the logits still vary over the vocabulary
    correlation: float  # LogitErrorSum.correlation with the source's logits


class LogitErrorSum:
    """relative_logit_error accumulated over several logit arrays [..., vocab]: the RMS of the
    differences over the RMS spread of the expected logits around their mean at each position. 0:
    equal; 1: as far as logits constant over the vocabulary; about 1.4: unrelated logits of the
    same spread. Scale-free, so one bound serves models whose logits span 2 or 30."""

    def __init__(self):
        self.squared_error, self.squared_spread = 0.0, 0.0
        self.squared_got_spread, self.cross = 0.0, 0.0  # for spread_ratio and correlation

    def add(self, got: np.ndarray, expected: np.ndarray) -> None:
        got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
        got_centred = got - got.mean(axis=-1, keepdims=True)
        expected_centred = expected - expected.mean(axis=-1, keepdims=True)
        self.squared_error += float(np.square(got - expected).sum())
        self.squared_spread += float(np.square(expected_centred).sum())
        self.squared_got_spread += float(np.square(got_centred).sum())
        self.cross += float((got_centred * expected_centred).sum())

    @property
    def value(self) -> float:
        return float(np.sqrt(self.squared_error / self.squared_spread)) if self.squared_spread else float("inf")

    @property
    def spread_ratio(self) -> float:
        """The RMS spread of the logits over the vocabulary, over the expected logits': about 0 for
        logits (near) constant over the vocabulary, which a relative error of about 1 lets pass."""
        return float(np.sqrt(self.squared_got_spread / self.squared_spread)) if self.squared_spread else 0.0

    @property
    def correlation(self) -> float:
        """The correlation of the logits with the expected ones over the vocabulary (pooled over
        positions): 1 for the same ordering of scale, about 0 for unrelated logits."""
        scale = np.sqrt(self.squared_got_spread * self.squared_spread)
        return float(self.cross / scale) if scale else 0.0


def relative_logit_error(got, expected) -> float:
    """LogitErrorSum's measure of one pair of logit arrays."""
    total = LogitErrorSum()
    total.add(got, expected)
    return total.value


def narrow_cache(kv_dtype: str, activation_dtype: str) -> bool:
    """Whether caches of `kv_dtype` are narrower than the activations (their drift is validated)."""
    width = {"int8": 1, "float16": 2, "float32": 4}
    return width[kv_dtype] < width[activation_dtype]


def validate_drift(source: SourceLogits, staged: pathlib.Path) -> Drift:
    """The logit drift from the float source graph, on validate_export's comparisons, of a folder
    with quantized weights (WEIGHT_TOLERANCES) or narrow caches (CACHE_TOLERANCES; both: the two
    tolerances added in quadrature, as independent roundings add). Raises ExportError when it passes
    its tolerance (or on non-finite logits)."""
    quest = QuestModel(staged, threads=1)
    settings = quest.sidecar.settings
    parts = []  # (what, tolerance, table)
    if settings.weights in WEIGHT_TOLERANCES:
        parts.append((f"{settings.weights} weights", WEIGHT_TOLERANCES[settings.weights], "WEIGHT_TOLERANCES"))
    if narrow_cache(settings.kv_dtype, quest.sidecar.geometry.activation_dtype):
        parts.append((f"{settings.kv_dtype} caches", CACHE_TOLERANCES[settings.kv_dtype], "CACHE_TOLERANCES"))
    if not parts:
        raise ValueError(f"{staged}: float weights and {settings.kv_dtype} caches have no drift to validate")
    what = " and ".join(part[0] for part in parts)
    tolerance = float(np.hypot(*[part[1] for part in parts])) if len(parts) > 1 else parts[0][1]
    total, largest = LogitErrorSum(), 0.0
    for where, got, expected in _comparisons(source, quest):
        if not np.isfinite(got).all():
            raise ExportError(f"validation failed: with {what} the logits are not finite at {where}")
        total.add(got, expected)
        largest = max(largest, float(np.abs(got - expected).max()))
    drift = Drift(what, total.value, tolerance, largest, total.spread_ratio, total.correlation)
    if not (drift.spread_ratio >= INFORMATIVE_SPREAD and drift.correlation >= INFORMATIVE_CORRELATION):
        raise ExportError(f"validation failed: with {what} the logits carry little of the source's information (their "
                          f"spread over the vocabulary is {drift.spread_ratio:.3g} of the float source graph's, their "
                          f"correlation with them {drift.correlation:.3g}; pipeline/validate.py asks for at least "
                          f"{INFORMATIVE_SPREAD} and {INFORMATIVE_CORRELATION}); export with a wider type")
    if not drift.relative_error <= drift.tolerance:
        tables = " and ".join(part[2] for part in parts)
        raise ExportError(f"validation failed: {what} move the logits by a relative error of "
                          f"{drift.relative_error:.3g} from the float source graph's, above the tolerance "
                          f"{drift.tolerance:.3g} (pipeline/validate.py {tables}); export with a wider type")
    return drift
