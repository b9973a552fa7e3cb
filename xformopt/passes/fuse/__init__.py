"""The fuse pass (``run``): ONNX Runtime's transformer optimizer or onnxscript's rewriter, candidates timed."""
