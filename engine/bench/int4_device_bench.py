"""4-bit weights (torch's int4 kernels, engine/quant/gpu_weights.py) on a GPU or a Mac: what a
lent device machine measures in one command (scripts/gpu_check.sh runs it).

    parity        the device's int4 / int8 kernels against the CPU reference (dequantized fp32),
                  at the default pair's and an 8B model's layer shapes, rows m = 1 .. 9; and
                  whether a row's result depends on how many rows the call had (the property
                  that makes greedy speculation equal plain decoding; torch does not promise it)
    pass costs    a target pass over m new tokens, 16-bit vs 4-bit, with random weights at the
                  default pair's shapes (Qwen2.5-Coder-1.5B / 0.5B) and an 8B one (Llama-3.1-8B's
                  dimensions in a Qwen2 module); the bytes the weights hold on the device against
                  the memory fit's figure; the drafter's cost per drafted token
    lossless      greedy speculation with the 4-bit model drafting for itself (every draft
                  accepted, so every pass verifies k+1 rows) against its plain decoding
    host syncs    synchronizing calls per generated token, plain and speculative (CUDA only:
                  torch.cuda.set_sync_debug_mode counts them)

    python -m engine.bench.int4_device_bench                 # on the best device
    python -m engine.bench.int4_device_bench --tiny          # tiny shapes on the CPU (seconds)
"""
from __future__ import annotations

import argparse
import copy
import logging
import warnings
from pathlib import Path

import torch

from engine.bench.gpu_bench import (
    SHAPES,
    TINY_SHAPES,
    build_random_model,
    draft_seconds_per_token,
    emit,
    target_pass_seconds,
)
from engine.quant.gpu_weights import to_4bit_device_weights
from kernels import int4pack
from kernels.int4pack import reference

log = logging.getLogger(__name__)

SHAPES_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 32768, "rope_theta": 500000.0,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
# (N, K) of the linear layers: the 1.5B's q/o, k/v, gate/up, down; the 8B's q, k/v, gate/up, down.
LAYER_SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (4096, 4096), (1024, 4096), (14336, 4096),
                (4096, 14336)]
TINY_LAYER_SHAPES = [(64, 64), (32, 64), (128, 64), (64, 128)]


class _IdsTokenizer:
    """The decoding loop's tokenizer is only for streaming text: token ids as text will do."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def kernel_parity(device: torch.device, shapes, rows=(1, 2, 5, 9)) -> list[dict]:
    """Per shape: worst |device - reference| over the bound of fp32 sums rounded once to the
    dtype (<= 1 passes), and whether each row equals that row computed alone."""
    dtype = int4pack.device_dtype(device)
    gen = torch.Generator().manual_seed(0)
    out = []
    for n, k in shapes:
        weights = int4pack.quantize(torch.randn(n, k, generator=gen) * 0.02, dtype)
        packed = int4pack.pack(weights, device, dtype)
        w = reference.dequantize(weights.codes, packed.scales_zeros.cpu())
        q, s = int4pack.quantize_int8(torch.randn(n, k, generator=gen) * 0.02, dtype)
        w8 = reference.dequantize_int8(q, s)
        q_dev, s_dev = q.to(device), s.to(device)
        x = torch.randn(max(rows), k, generator=gen).to(dtype)
        x_dev = x.to(device)
        row = {"n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "int4_worst": 0.0, "int8_worst": 0.0,
               "int4_rows_alone_equal": True, "int8_rows_alone_equal": True}
        for m in rows:
            for kind, got, want, wt in (("int4", int4pack.linear(x_dev[:m], packed), x[:m].float() @ w.t(), w),
                                        ("int8", int4pack.linear_int8(x_dev[:m], q_dev, s_dev), x[:m].float() @ w8.t(), w8)):
                got = got.float().cpu()
                bound = 2 * torch.abs(want) * 2.0 ** -8 + 2.0 ** -20 * (x[:m].float().abs() @ wt.abs().t()) + 1e-6
                row[f"{kind}_worst"] = max(row[f"{kind}_worst"], float(((got - want).abs() / bound).max()))
            full4, full8 = int4pack.linear(x_dev[:m], packed), int4pack.linear_int8(x_dev[:m], q_dev, s_dev)
            for i in range(m):
                row["int4_rows_alone_equal"] &= bool(torch.equal(int4pack.linear(x_dev[i:i + 1], packed), full4[i:i + 1]))
                row["int8_rows_alone_equal"] &= bool(torch.equal(int4pack.linear_int8(x_dev[i:i + 1], q_dev, s_dev), full8[i:i + 1]))
        out.append(row)
    return out


def _weight_bytes(model: torch.nn.Module) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


def pass_costs(shape: dict, drafter_shape: dict | None, device: torch.device, context: int, max_rows: int,
               reps: int) -> dict:
    """16-bit then 4-bit (the same model converted in place) target passes, m = 1 .. max_rows."""
    from engine.models.planning.architecture import architecture_from_config
    from engine.models.planning.memory_fit import int4_device_bytes

    dtype = int4pack.device_dtype(device)
    model = build_random_model(shape, dtype, device, seed=0)
    params = sum(p.numel() for p in model.parameters())
    result = {"params": params, "dtype": str(dtype).removeprefix("torch."),
              "bf16_seconds": target_pass_seconds(model, context, max_rows, reps), "bf16_weight_bytes": _weight_bytes(model)}
    report = to_4bit_device_weights(model, device, dtype=dtype)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result["int4_seconds"] = target_pass_seconds(model, context, max_rows, reps)
    result["int4_weight_bytes"] = _weight_bytes(model)
    result["memory_fit_int4_bytes"] = int4_device_bytes(params, architecture_from_config(model.config.to_dict()))
    result["int4_bits_per_weight"] = report.int4_bits_per_weight
    result["convert_seconds"] = report.seconds
    del model
    if drafter_shape is not None:
        drafter = build_random_model(drafter_shape, dtype, device, seed=1)
        result["drafter_bf16_seconds_per_token"] = draft_seconds_per_token(drafter, context, 4, reps)
        to_4bit_device_weights(drafter, device, tables="keep", dtype=dtype)
        result["drafter_int4_seconds_per_token"] = draft_seconds_per_token(drafter, context, 4, reps)
        del drafter
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _count_syncs(device: torch.device, fn) -> int | None:
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def lossless_and_syncs(shape: dict, device: torch.device, new_tokens: int, k: int) -> dict:
    """Greedy: the 4-bit model's plain decoding vs speculation with itself as the drafter, and
    host syncs per generated token for both (and for the 16-bit model's plain decoding)."""
    from engine.core.events import Finished
    from engine.core.settings import DecodeSettings
    from engine.decode.decoding import plain_decode, speculative_decode
    from engine.drafters import DraftModelDrafter
    from engine.models.runners.runner import ModelRunner

    dtype = int4pack.device_dtype(device)
    tok = _IdsTokenizer()
    prompt = torch.randint(0, shape["vocab_size"], (24,), generator=torch.Generator().manual_seed(4)).tolist()
    model = build_random_model(shape, dtype, device, seed=2)

    def tokens(events):
        return next(e for e in events if isinstance(e, Finished)).token_ids

    def plain(m):
        return tokens(plain_decode(ModelRunner(m), tok, prompt, DecodeSettings(max_new_tokens=new_tokens), set()))

    def speculative(m):
        settings = DecodeSettings(max_new_tokens=new_tokens, draft_length=k)
        return tokens(speculative_decode(ModelRunner(m), DraftModelDrafter(copy.deepcopy(m)), tok, prompt, settings, set()))

    out = {"bf16_plain_syncs_per_token": None}
    syncs = _count_syncs(device, lambda: plain(model))
    out["bf16_plain_syncs_per_token"] = None if syncs is None else syncs / new_tokens
    to_4bit_device_weights(model, device, dtype=dtype)
    plain_ids, spec_ids = plain(model), speculative(model)
    first = next((i for i, (a, b) in enumerate(zip(plain_ids, spec_ids)) if a != b), None)
    out.update({"int4_speculative_equals_plain": plain_ids == spec_ids, "first_difference": first, "k": k,
                "tokens": len(plain_ids)})
    for name, fn in (("int4_plain", plain), ("int4_speculative", speculative)):
        syncs = _count_syncs(device, lambda fn=fn: fn(model))
        out[f"{name}_syncs_per_token"] = None if syncs is None else syncs / new_tokens
    return out


def run(tiny: bool, device: str, context: int, reps: int) -> dict:
    from engine.models.loading.placement import pick_device

    dev = pick_device(device)
    reason = int4pack.unsupported_reason(dev)
    if reason is not None:
        raise SystemExit(f"4-bit weights cannot run on {dev}: {reason}")
    if tiny:
        context, reps = min(context, 16), min(reps, 3)
    shapes = TINY_SHAPES if tiny else SHAPES
    result = {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
              "torch": torch.__version__, "tiny": tiny, "context": context,
              "parity": kernel_parity(dev, TINY_LAYER_SHAPES if tiny else LAYER_SHAPES)}
    result["costs"] = {"default pair": pass_costs(shapes["target"], shapes["drafter"], dev, context, 9, reps)}
    if not tiny:
        result["costs"]["8B"] = pass_costs(SHAPES_8B, None, dev, context, 9, reps)
    result["lossless"] = lossless_and_syncs(shapes["target"], dev, new_tokens=8 if tiny else 48, k=4)
    return result


def report(result: dict) -> str:
    from engine.models.planning.memory_fit import human_bytes as gb

    ms = lambda s: f"{s * 1000:7.2f} ms"  # noqa: E731
    lines = [f"4-bit weights on {result['device']} ({result['device_name']}), torch {result['torch']}"
             f"{', TINY shapes' if result['tiny'] else ''}, context {result['context']}",
             "\nparity vs the CPU reference (worst error / allowed, <= 1 passes; rows alone == in a batch):"]
    for p in result["parity"]:
        lines.append(f"  [{p['n']:>5} x {p['k']:>5}] {p['dtype']}  int4 {p['int4_worst']:5.2f} "
                     f"{'invariant' if p['int4_rows_alone_equal'] else 'ROWS DIFFER'}   int8 {p['int8_worst']:5.2f} "
                     f"{'invariant' if p['int8_rows_alone_equal'] else 'ROWS DIFFER'}")
    for name, c in result["costs"].items():
        b16, b4 = c["bf16_seconds"], c["int4_seconds"]
        lines.append(f"\n[{name}] {c['params'] / 1e9:.2f}B params: weights {gb(c['bf16_weight_bytes'])} at {c['dtype']}, "
                     f"{gb(c['int4_weight_bytes'])} at 4 bits (memory fit: {gb(c['memory_fit_int4_bytes'])}; "
                     f"{c['int4_bits_per_weight']:.2f} bits a 4-bit weight; converted in {c['convert_seconds']:.1f} s)")
        lines.append("   m   16-bit    4-bit    4-bit/16-bit   v(m) 16 / 4")
        for m in b16:
            lines.append(f"  {m:>2} {ms(b16[m])} {ms(b4[m])}   {b4[m] / b16[m]:5.2f}        "
                         f"{b16[m] / b16[1]:4.2f} / {b4[m] / b4[1]:4.2f}")
        if "drafter_bf16_seconds_per_token" in c:
            lines.append(f"  drafter per drafted token: {ms(c['drafter_bf16_seconds_per_token'])} 16-bit, "
                         f"{ms(c['drafter_int4_seconds_per_token'])} 4-bit")
    lo = result["lossless"]
    same = "token-identical" if lo["int4_speculative_equals_plain"] else f"DIFFERS from token {lo['first_difference']}"
    lines.append(f"\ngreedy speculation (k={lo['k']}, the 4-bit model drafting for itself) vs plain, {lo['tokens']} tokens: {same}")
    syncs = [f"{k.removesuffix('_syncs_per_token')} {v:.1f}" for k, v in lo.items() if k.endswith("_syncs_per_token") and v is not None]
    lines.append("host syncs per token: " + (", ".join(syncs) if syncs else "not counted here (CUDA only)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.int4_device_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a quick check, on a CPU too)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = run(args.tiny, args.device, args.context, args.reps)
    emit(result, report(result), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
