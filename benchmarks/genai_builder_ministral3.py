"""Can onnxruntime-genai's builder build a text-only Ministral 3 checkpoint? It knows Ministral 3 only as the
vision-language ``Mistral3ForConditionalGeneration``, so the tiny text model of tests/tiny_decoders.py is
wrapped in one (a one-layer Pixtral vision tower beside it), built at fp32 for CPU, and its greedy 32 tokens
compared with transformers' ``generate`` on the text model.

    PYTHONPATH=. python benchmarks/genai_builder_ministral3.py [WORK_DIR]

Prints the graph's inputs, whether it has GroupQueryAttention and where greedy decoding first diverges.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _wrapped(root: Path) -> tuple[Path, Path]:
    import tiny_decoders
    import transformers

    text_dir = tiny_decoders.build(root / "text", "ministral3", seed=0)
    text = transformers.AutoModelForCausalLM.from_pretrained(text_dir).eval()
    vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=32, patch_size=16)
    vlm = transformers.Mistral3ForConditionalGeneration(
        transformers.Mistral3Config(text_config=text.config, vision_config=vision)).eval()
    vlm.model.language_model.load_state_dict(text.model.state_dict(), strict=True)
    vlm.lm_head.load_state_dict(text.lm_head.state_dict())
    vlm.save_pretrained(root / "vlm")
    for f in text_dir.iterdir():
        if "token" in f.name:
            shutil.copy(f, root / "vlm" / f.name)
    return text_dir, root / "vlm"


def main(root: Path) -> None:
    import collections

    import onnx
    import torch
    from onnxruntime_genai.models import builder
    from transformers import AutoModelForCausalLM

    from xformopt.decoder.generate import generate
    from xformopt.models import load_tokenizer
    from xformopt.passes.export.decoder import pin_head_dim
    from xformopt.runtime.decoder import OrtDecoder

    shutil.rmtree(root, ignore_errors=True)
    text_dir, vlm_dir = _wrapped(root)
    out = root / "onnx"
    with tempfile.TemporaryDirectory() as cache:
        extra = builder.parse_extra_options(None, str(vlm_dir), str(out), "fp32", "cpu", cache, [])
        builder.create_model(None, str(vlm_dir), str(out), "fp32", "cpu", cache, **extra)
    pin_head_dim(out / "model.onnx", text_dir)
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    print("inputs:", [i.name for i in graph.input][:3], "GroupQueryAttention:", ops["GroupQueryAttention"])
    prompt = list(load_tokenizer(text_dir)("The movie was a")["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(text_dir).eval()
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                         pad_token_id=0)[0, len(prompt):].tolist()
    got = generate(OrtDecoder(out, threads=1), prompt, 32).new_ids
    first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    print(f"greedy 32 tokens equal to transformers: {ref == got}; first divergent token: {first}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "genai-builder-ministral3")
