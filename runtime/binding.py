"""IOBinding with outputs bound to their inputs' buffers, so a step updates caches in place; a
cache's buffers bound once (plan), a step's own feeds per step."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort


@dataclasses.dataclass(frozen=True)
class BoundStep:
    """An IOBinding with what must outlive it: the OrtValues of the NumPy feeds, and the arrays
    outputs are written into."""

    binding: ort.IOBinding
    values: dict[str, ort.OrtValue]
    into: dict[str, np.ndarray]


class InPlaceStep:
    """Runs a session with each aliased output bound to its input's OrtValue.

    `aliases` maps an output name to the input whose buffer it shares (e.g. key_cache_out ->
    key_cache); aliases naming outputs the session lacks are ignored. The caller keeps the
    OrtValues of the aliased inputs across steps: ONNX Runtime hands the op the same pointer for
    both, and the op writes only the new tokens.
    """

    def __init__(self, session: ort.InferenceSession, aliases: Mapping[str, str]):
        self.session = session
        self.outputs = [o.name for o in session.get_outputs()]
        self.inputs = [i.name for i in session.get_inputs()]
        self.aliases = {out: inp for out, inp in aliases.items() if out in self.outputs}

    def plan(self, fixed: Mapping[str, ort.OrtValue]) -> BoundStep:
        """An IOBinding with the `fixed` inputs (a cache's OrtValues, the same every step) and the
        outputs aliased to them bound once; `bind(feeds, plan=...)` then binds only a step's own
        feeds and outputs into it (ONNX Runtime replaces a name bound again)."""
        binding = self.session.io_binding()
        for name, value in fixed.items():
            binding.bind_ortvalue_input(name, value)
        # Every output in the session's order (get_outputs lists them in the order first bound; a
        # name bound again keeps its place): the aliased ones for good, the rest until a step's own.
        for output in self.outputs:
            if self.aliases.get(output) in fixed:
                binding.bind_ortvalue_output(output, fixed[self.aliases[output]])
            else:
                binding.bind_output(output, "cpu")
        return BoundStep(binding, dict(fixed), {})

    def bind(self, feeds: Mapping[str, np.ndarray | ort.OrtValue],
             into: Mapping[str, np.ndarray] | None = None, plan: BoundStep | None = None) -> BoundStep:
        """An IOBinding for these feeds, reusable for repeated runs on the same buffers. `into` maps
        outputs to arrays of their exact shape and type that the run writes (no copy afterwards; a
        binding run again writes and returns the same arrays). `plan` (from plan()): its binding,
        its fixed inputs left as they are, the rest bound now (that binding is then this step's)."""
        into = into or {}
        fixed = {} if plan is None else plan.values
        # An input left unbound reaches the ops as no tensor at all: name it here instead.
        missing = [name for name in self.inputs if name not in feeds and name not in fixed]
        if missing:
            raise ValueError(f"graph inputs not fed: {', '.join(missing)}")
        for name, array in into.items():
            # ONNX Runtime would write a contiguous copy of any other array, leaving it unwritten.
            if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable):
                raise ValueError(f"output {name}: the array to write it into must be a C-contiguous, writeable "
                                 "NumPy array")
        # A plan's binding keeps, between runs, the last step's feeds and outputs: each is bound again
        # before the next run (every input not fixed is fed: checked above), none is read before.
        binding = self.session.io_binding() if plan is None else plan.binding
        values = {}  # the feeds' OrtValues (a plan's fixed ones live in the cache)
        for name, value in feeds.items():
            if not isinstance(value, ort.OrtValue):
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
            values[name] = value
            binding.bind_ortvalue_input(name, value)
        for name in self.outputs:
            if name in self.aliases and self.aliases[name] in fixed:
                continue  # bound by the plan
            if name in self.aliases:
                binding.bind_ortvalue_output(name, values[self.aliases[name]])
            elif name in into:
                binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(into[name]))
            else:
                binding.bind_output(name, "cpu")
        return BoundStep(binding, values, dict(into))

    def run_bound(self, bound: BoundStep) -> dict[str, np.ndarray]:
        """Run a prepared binding; returns the outputs that are not aliased, as NumPy arrays (those
        bound `into` arrays: the arrays themselves)."""
        self.session.run_with_iobinding(bound.binding)
        produced = bound.binding.get_outputs()
        return {name: bound.into[name] if name in bound.into else value.numpy()
                for name, value in zip(self.outputs, produced) if name not in self.aliases}

    def run(self, feeds: Mapping[str, np.ndarray | ort.OrtValue],
            into: Mapping[str, np.ndarray] | None = None, plan: BoundStep | None = None) -> dict[str, np.ndarray]:
        """Bind (into `plan`'s binding, when given) and run once."""
        return self.run_bound(self.bind(feeds, into, plan))
