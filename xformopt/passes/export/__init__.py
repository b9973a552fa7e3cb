"""The export pass: ``run`` (options, the exporters by family route, parity against PyTorch) and
``dynamo`` (torch.onnx's dynamo exporter with onnxscript's fusions)."""
