"""Runners: ``encoder`` (texts -> the task's outputs, PyTorch or ONNX Runtime), ``decoder`` (KV-cache
step runners), and ``session`` (the ONNX Runtime session both open)."""
