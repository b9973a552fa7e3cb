"""The int4 pass (``run``): 4-bit weight-only MatMulNBits for decoders; ``gguf_blocks`` carries a GGUF's
4-bit blocks over exactly."""
