"""Runs a pickled batch of op calls in its own process for test_properties.py, recording each error.

Prints `case i` before each call, so that when a call kills the process the parent can say which.
"""

from __future__ import annotations

import json
import pickle
import sys

import onnxruntime as ort

from quest_ort.runtime.single_op import run_op


def main(batch: str, results: str) -> None:
    ort.set_default_logger_severity(4)  # the rejections are expected; the parent checks their messages
    with open(batch, "rb") as f:
        cases = pickle.load(f)
    outcomes = []
    for index, case in enumerate(cases):
        print(f"case {index}", flush=True)
        try:
            run_op(case["op"], case["inputs"], case["attributes"], outputs=case.get("outputs"), symbolic_dims=False)
            outcomes.append({"error": None})
        except Exception as error:  # ORT reports every rejection as an exception; the message is checked
            outcomes.append({"error": f"{type(error).__name__}: {error}"})
    with open(results, "w") as f:
        json.dump(outcomes, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
