"""GGUF models run natively: the file memory-mapped, its quantized weights computed as they are.

    header          a header's metadata and tensor table in one pass (gguf-py's values, ~300x faster)
    reader          open a .gguf file or split set: metadata, zero-copy tensor views, clear errors
    hf_metadata     transformers' config and tokenizer from that parse (its tables and converters)
    metadata_cache  the header's products (tensor table, config, tokenizer) cached per file
    modules         GgufLinear / DenseLinear / GgufEmbedding over the file's tensors
    model           the transformers model a file describes, built on those modules
    loader          ``load_gguf(path)``: all of it, for engine.models.loading.loader

The kernels are kernels.gguf_linear (llama.cpp's recipe: inputs quantized per block, integer
products; batch-invariant, so speculation on a GGUF target is token-identical to its plain
decoding).
"""
from engine.gguf.reader import GgufError, is_gguf

__all__ = ["GgufError", "is_gguf"]
