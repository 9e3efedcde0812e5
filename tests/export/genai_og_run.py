"""An exported folder run by onnxruntime-genai itself (og.Model, og.Tokenizer, og.Generator), for the
tests to compare with this package's runtime: run with the genai venv's Python, never imported:

    build/genai-venv/bin/python tests/export/genai_og_run.py FOLDER STEPS REQUEST_JSON

REQUEST_JSON is {"ids": [...]} or {"messages": [...]} (rendered and encoded by og.Tokenizer). Prints
{"prompt": the ids fed, "tokens": the greedy tokens, up to and including an EOS id, "text": their
decoding by og.Tokenizer} as JSON.
"""

from __future__ import annotations

import json
import sys

import onnxruntime_genai as og


def main() -> None:
    folder, steps, request = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    model = og.Model(folder)
    tokenizer = og.Tokenizer(model)
    if "messages" in request:
        text = tokenizer.apply_chat_template(json.dumps(request["messages"]), add_generation_prompt=True)
        prompt = [int(t) for t in tokenizer.encode(text)]
    else:
        prompt = request["ids"]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + steps)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    print(json.dumps({"prompt": prompt, "tokens": tokens, "text": tokenizer.decode(tokens)}))


if __name__ == "__main__":
    main()
