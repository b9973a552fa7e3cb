"""xformopt: export, prune, distill, fuse and quantize Hugging Face transformers into verified ONNX artifacts."""

__version__ = "0.1.0"
