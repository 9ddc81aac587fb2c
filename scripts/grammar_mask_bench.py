"""What a JSON-schema token mask costs with each grammar engine, on the default pair's tokenizer.

    .venv/bin/python scripts/grammar_mask_bench.py [--json out.json]

For each schema: the time to compile it (and, once, to read the 152k-token vocabulary), and
the mask's cost per token along a valid reply's tokens (mean and the slowest). Tandem uses
llguidance (a dependency); xgrammar and outlines-core are measured where installed
(``pip install --no-deps xgrammar apache-tvm-ffi outlines-core`` beside the set-up venv).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from transformers import AutoTokenizer

from engine.models.loading import default_pair

SCHEMAS = {
    "person": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                 "languages": {"type": "array", "items": {"type": "string"}}},
                "required": ["name", "age", "languages"], "additionalProperties": False},
               {"name": "Ada Lovelace", "age": 36, "languages": ["Python", "C++", "Java"]}),
    "function": ({"type": "object", "properties": {"function_name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
                                                   "arguments": {"type": "array", "items": {"type": "string"}},
                                                   "returns": {"enum": ["int", "str", "bool", "list", "None"]}},
                  "required": ["function_name", "arguments", "returns"], "additionalProperties": False},
                 {"function_name": "is_palindrome", "arguments": ["text", "ignore_case"], "returns": "bool"}),
}


def _timed(steps):
    costs = []
    for step in steps:
        t = time.perf_counter()
        step()
        costs.append(time.perf_counter() - t)
    return costs


def bench_llguidance(tokenizer, n_vocab, eos, schema, ids):
    import llguidance
    import llguidance.hf

    from engine.core.settings import JSON_WHITESPACE

    t = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)
    vocab_s = time.perf_counter() - t
    t = time.perf_counter()
    matcher = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(
        schema, overrides={"whitespace_pattern": JSON_WHITESPACE}))
    compile_s = time.perf_counter() - t
    costs = []
    for token in ids:
        t = time.perf_counter()
        matcher.compute_bitmask()
        costs.append(time.perf_counter() - t)
        assert matcher.consume_token(token), matcher.get_error()
    return vocab_s, compile_s, costs


def bench_xgrammar(tokenizer, n_vocab, eos, schema, ids):
    import xgrammar

    t = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=n_vocab, stop_token_ids=eos)
    compiler = xgrammar.GrammarCompiler(info)
    vocab_s = time.perf_counter() - t
    t = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t
    bitmask = xgrammar.allocate_token_bitmask(1, n_vocab)
    costs = []
    for token in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        costs.append(time.perf_counter() - t)
        assert matcher.accept_token(token)
    return vocab_s, compile_s, costs


def bench_outlines(tokenizer, n_vocab, eos, schema, ids):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t = time.perf_counter()
    tokens: dict[str, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i not in eos:
            tokens.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(i)
    vocabulary = Vocabulary(eos[0], tokens)
    vocab_s = time.perf_counter() - t
    t = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(schema), r"[ ]?"), vocabulary)
    guide = Guide(index)
    compile_s = time.perf_counter() - t
    costs = []
    for token in ids[:-1]:  # its guide ends at the value's last token: the end of text is implied
        t = time.perf_counter()
        guide.get_tokens()
        costs.append(time.perf_counter() - t)
        guide.advance(token)
    return vocab_s, compile_s, costs


ENGINES = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar, "outlines-core": bench_outlines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    paths = default_pair.installed_paths()
    if paths is None:
        raise SystemExit("the default pair is not installed: run `make setup`")
    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    n_vocab, eos = 151936, [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    rows = []
    for engine, bench in ENGINES.items():
        for name, (schema, reply) in SCHEMAS.items():
            ids = tokenizer.encode(json.dumps(reply)) + [eos[0]]
            try:
                vocab_s, compile_s, costs = bench(tokenizer, n_vocab, eos, schema, ids)
            except ImportError as exc:
                print(f"{engine:14s} not installed ({exc.name})")
                break
            except Exception as exc:  # an engine that cannot take the schema is a result too
                print(f"{engine:14s} {name:9s} failed: {type(exc).__name__}: {exc}")
                continue
            row = {"engine": engine, "schema": name, "vocabulary_s": round(vocab_s, 3), "compile_ms": round(compile_s * 1e3, 2),
                   "mask_us_mean": round(statistics.mean(costs) * 1e6, 1), "mask_us_max": round(max(costs) * 1e6, 1),
                   "tokens": len(ids)}
            rows.append(row)
            print(f"{engine:14s} {name:9s} vocabulary {vocab_s:6.2f} s  compile {compile_s * 1e3:9.2f} ms  "
                  f"mask {row['mask_us_mean']:8.1f} us a token (slowest {row['mask_us_max']:.0f}) over {len(ids)} tokens")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
