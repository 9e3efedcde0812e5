"""Greedy tokens of a builder model by onnxruntime-genai itself (its Generator), for the tests to
compare with: run with the builder venv's Python, never imported by the tests:

    build/genai-venv/bin/python tests/export/genai_og_greedy.py MODEL_FOLDER TOKENS PROMPT_JSON

prints the TOKENS generated tokens as JSON (EOS ids do not stop it: min_length keeps it going).
"""

from __future__ import annotations

import json
import sys

import onnxruntime_genai as og


def main() -> None:
    folder, steps, prompt = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    total = len(prompt) + steps
    params.set_search_options(do_sample=False, max_length=total, min_length=total)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    tokens = []
    while len(tokens) < steps and not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    print(json.dumps(tokens))


if __name__ == "__main__":
    main()
