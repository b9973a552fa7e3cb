"""The prune pass: ``run`` (options, the steps, the record), ``importance`` (Taylor and magnitude scores),
``plans`` (what to keep per layer), ``flops`` (the encoder FLOPs model plans are sized by) and ``timing``
(pruned vs unpruned ONNX timed interleaved)."""
