"""Adapters that let the clients a model came from run its ONNX artifact: a transformers ``pipeline``
model and a sentence-transformers module. Each imports its client library at module top, so nothing
here is imported unless a user asks for it."""
