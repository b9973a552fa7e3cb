"""`xformopt profile`: where an ONNX artifact's time goes, from ONNX Runtime's own profiler."""
