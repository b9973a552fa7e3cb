"""INT8 formats vs output cosine on the kernel this process runs, for one fused encoder graph.

Quantizes the graph (dynamic INT8) in every weight format xformopt's targets and ladder can write,
then compares each one's outputs with the float graph on real held-out texts. Run it natively for
this host, and under an emulated CPU to see another host's kernel (ONNX Runtime picks its INT8 GEMM
from CPUID, which qemu-user answers), e.g. an AVX2-only CPU on an AVX-512 VNNI machine:

    xformopt export minilm -o /tmp/e && xformopt fuse /tmp/e -o /tmp/f --select all
    python benchmarks/int8_formats.py /tmp/f
    qemu-x86_64 -cpu Haswell "$(which python)" benchmarks/int8_formats.py /tmp/f

Under emulation each session takes minutes; the AVX2 column of docs/results/encoders.md was made from the same quantized
graphs (quantization is host-independent) with only the inference run under qemu.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

FORMATS = [  # (weights, per-channel, reduce-range)
    ("int8", False, False), ("int8", True, False), ("int8", False, True), ("int8", True, True), ("uint8", True, False),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", type=Path, help="an ONNX stage folder (model.onnx + tokenizer), e.g. fuse's output")
    parser.add_argument("--texts", type=int, default=32)
    args = parser.parse_args()

    from xformopt.measure.kernel_probe import int8_gemm_saturates
    from xformopt.passes.quantize.builders import quantize_dynamic_graph
    from xformopt.resources import vader_split_path
    from xformopt.runtime.encoder import OrtPredictor
    from xformopt.scoring.metrics import row_cosine
    from xformopt.sources import resolve

    spec = resolve(str(args.stage))
    lines = vader_split_path("test").read_text(encoding="utf-8").splitlines()[: args.texts]
    texts = [json.loads(line)["text"] for line in lines]
    reference = OrtPredictor(spec, args.stage, threads=2).predict(texts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for weights, per_channel, reduce_range in FORMATS:
            out = Path(tmp) / f"{weights}-{per_channel}-{reduce_range}"
            out.mkdir()
            formats = {"weight_type": weights, "per_channel": per_channel, "reduce_range": reduce_range}
            quantize_dynamic_graph(args.stage / "model.onnx", out / "model.onnx", formats, ["MatMul", "Attention", "Gemm"], [])
            got = OrtPredictor(spec, out, threads=2, tokenizer_dir=args.stage).predict(texts)
            cos = row_cosine(reference, got)
            rows.append({"weights": weights, "per_channel": per_channel, "reduce_range": reduce_range,
                         "mean_cosine": round(float(cos.mean()), 4), "min_cosine": round(float(cos.min()), 4)})
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"int8_gemm_saturates": int8_gemm_saturates(), "texts": len(texts), "formats": rows}))


if __name__ == "__main__":
    main()
