"""Speculation under a JSON schema against speculation without one, on the default pair.

    .venv/bin/python scripts/structured_bench.py [--json out.json] [--max-new-tokens 160]

For each prompt, in one run: plain and speculative decoding (draft model, greedy), each with
the prompt's schema and without; prints decode tok/s after the first token, the speedup,
acceptance, whether speculative equals plain, whether the constrained reply validates, and
what the grammar mask cost per generated token. Under a schema, plain decoding runs twice: with
the tokens the schema allows alone committed without a pass (as Tandem decodes) and with a pass
for every token (as before), so the gain of each is seen apart.
"""
from __future__ import annotations

import argparse
import json
import time

import jsonschema

from engine.core.settings import DecodeSettings, OutputFormat
from engine.decode import grammar
from engine.models.loading import default_pair
from engine.session.compare import drain, warm_up
from engine.session.session import Session

CASES = [
    ("Describe Ada Lovelace as a person record with her name, birth year and three known works.",
     {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"},
                                       "works": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
      "required": ["name", "born", "works"], "additionalProperties": False}),
    ("List the parameters of Python's built-in sorted() function, each with its type and default.",
     {"type": "object", "properties": {"function": {"type": "string"},
                                       "parameters": {"type": "array", "maxItems": 4, "items": {
                                           "type": "object", "properties": {"name": {"type": "string"},
                                                                            "type": {"type": "string"},
                                                                            "default": {"type": "string"}},
                                           "required": ["name", "type", "default"], "additionalProperties": False}}},
      "required": ["function", "parameters"], "additionalProperties": False}),
    ("Write a JSON config for a web server: host, port, TLS on or off, and three allowed origins.",
     {"type": "object", "properties": {"host": {"type": "string"}, "port": {"type": "integer"},
                                       "tls": {"type": "boolean"},
                                       "allowed_origins": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
      "required": ["host", "port", "tls", "allowed_origins"], "additionalProperties": False}),
]


class _MaskClock:
    """Adds up the time GrammarConstraint.mask takes (wrapping it for the run)."""

    def __init__(self) -> None:
        self.seconds, self.rows = 0.0, 0
        self._mask = grammar.GrammarConstraint.mask

    def __enter__(self):
        clock, original = self, self._mask

        def timed(constraint, logits, draft=()):
            t = time.perf_counter()
            try:
                return original(constraint, logits, draft)
            finally:
                clock.seconds += time.perf_counter() - t
                clock.rows += logits.shape[0]

        grammar.GrammarConstraint.mask = timed
        return self

    def __exit__(self, *exc) -> None:
        grammar.GrammarConstraint.mask = self._mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    paths = default_pair.installed_paths()
    if paths is None:
        raise SystemExit("the default pair is not installed: run `make setup`")
    session = Session.load(default_pair.gguf_file(default_pair.TARGET), paths[1], precision="file")
    warm_up(session)
    rows = []
    for prompt, schema in CASES:
        ids = session.encode(prompt)
        for constrained in (False, True):
            fmt = OutputFormat("json_schema", json.dumps(schema)) if constrained else None
            settings = DecodeSettings(max_new_tokens=args.max_new_tokens, output_format=fmt)
            unforced = None
            if constrained:
                grammar.COMMIT_FORCED = False
                session.forget_prefixes()
                unforced = drain(session.plain(ids, settings))
                grammar.COMMIT_FORCED = True
            session.forget_prefixes()
            with _MaskClock() as plain_masks:
                plain = drain(session.plain(ids, settings))
            session.forget_prefixes()
            with _MaskClock() as spec_masks:
                spec = drain(session.speculative(ids, settings, "model"))
            valid = None
            if constrained:
                try:
                    jsonschema.validate(json.loads(spec.text), schema)
                    valid = True
                except (ValueError, jsonschema.ValidationError):
                    valid = False
            p, s = plain.stats.decode_tok_per_s, spec.stats.decode_tok_per_s
            row = {"prompt": prompt[:48], "schema": constrained, "tokens": len(spec.token_ids),
                   "plain_tok_s": round(p, 2), "speculative_tok_s": round(s, 2), "speedup": round(s / p, 3) if p else None,
                   "acceptance": round(spec.stats.acceptance, 3), "identical": plain.token_ids == spec.token_ids,
                   "valid": valid, "finish": spec.reason, "forced_tokens": spec.stats.forced_tokens,
                   "plain_pass_a_token_tok_s": round(unforced.stats.decode_tok_per_s, 2) if unforced else None,
                   "forced_identical": unforced.token_ids == plain.token_ids if unforced else None,
                   "speedup_over_pass_a_token": round(s / unforced.stats.decode_tok_per_s, 3) if unforced else None,
                   "mask_ms_per_token": round(plain_masks.seconds * 1e3 / max(1, len(plain.token_ids)), 3) if constrained else None,
                   "mask_ms_per_verified_row": round(spec_masks.seconds * 1e3 / max(1, spec_masks.rows), 3) if constrained else None}
            rows.append(row)
            print(json.dumps(row))
    def geomean(values) -> float:
        values = [v for v in values if v]
        product = 1.0
        for v in values:
            product *= v
        return product ** (1 / len(values)) if values else float("nan")

    for constrained in (False, True):
        chosen = [r for r in rows if r["schema"] == constrained]
        print(f"{'with' if constrained else 'without'} a schema: geometric-mean speedup "
              f"{geomean(r['speedup'] for r in chosen):.2f}x over {len(chosen)} prompts")
    constrained = [r for r in rows if r["schema"]]
    print(f"with a schema, over a pass a token: plain {geomean(r['plain_tok_s'] / r['plain_pass_a_token_tok_s'] for r in constrained):.2f}x, "
          f"speculative {geomean(r['speedup_over_pass_a_token'] for r in constrained):.2f}x; "
          f"{sum(r['forced_tokens'] for r in constrained)} of {sum(r['tokens'] for r in constrained)} tokens forced")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
