"""Pure tensor functions on Tandem's hot path.

Each op has a pure-torch reference that is the specification; faster backends may sit beside it
and are chosen once at import. Nothing here knows about models, tokenizers or Qt.
"""


# The packages with a compiled CPU backend, by what they do (for set-up and self-test reports).
CPU_KERNELS = {"linear": "bf16 linear", "quant_linear": "int8 linear", "int4_linear": "int4 linear",
               "draft_decoder": "int8/int4 decoder layer", "attention": "attention", "gguf_linear": "gguf linear",
               "norm": "residual RMS norm"}


def cpu_kernel_report() -> str:
    """'bf16 linear cpu_avx2, int8 linear cpu_avx2 (AVX-512 VNNI), ...': the backend each
    package runs on here (compiling, or in a packaged app loading, the fast ones on first use)."""
    import importlib

    parts = []
    for package, what in CPU_KERNELS.items():
        module = importlib.import_module(f"kernels.{package}")
        detail = getattr(module, "backend_detail", module.backends.detail)  # a package may word its own
        parts.append(f"{what} {module.backends.active_name()}{detail()}")
    return ", ".join(parts)
