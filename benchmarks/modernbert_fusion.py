"""ModernBERT's fusion at a mid size, offline: a random ModernBERT (hidden 384, 6 layers: 2 global, 4 with
a 128-token sliding window) with MiniLM's WordPiece tokenizer, through export -> fuse (select=fastest,
timed on this host) -> dynamic INT8; then fused vs unfused vs PyTorch on texts past the window and a
padded batch. No real ModernBERT checkpoint is available offline; random weights say nothing about
accuracy, only about fusion, parity and speed.

    python benchmarks/modernbert_fusion.py --out /tmp/modernbert-mid
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a scratch folder (replaced)")
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()

    import torch
    from transformers import ModernBertConfig, ModernBertModel

    from xformopt import pipeline, sources, targets
    from xformopt.exporting import compare
    from xformopt.measure import host
    from xformopt.passes import get_pass
    from xformopt.runtime.encoder import OrtPredictor, TorchPredictor

    root = args.out
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tokenizer_dir = sources.resolve("minilm").path
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1152,
        max_position_embeddings=512, global_attn_every_n_layers=3, local_attention=128,
        pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102)
    ModernBertModel(config).eval().save_pretrained(root / "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy2(Path(tokenizer_dir) / name, root / "model" / name)
    spec = sources.resolve(str(root / "model"))
    ctx = pipeline.verification_context(spec, targets.detect(), None, None, 1, host.effective_cpu_flags(),
                                        lambda m: print(m, flush=True))
    result: dict = {}
    src = root / "model"
    for name, options in (("export", {}), ("fuse", {"select": "fastest", "timing_rounds": args.rounds}),
                          ("quantize", {})):
        cls = get_pass(name)
        (root / name).mkdir()
        record = cls().run(ctx, src, root / name, cls.Options.model_validate(options))
        result[name] = {k: record[k] for k in ("exporter", "parity", "fusion_route", "fused_possible", "kept",
                                               "reason", "timings_ms") if k in record}
        src = root / name
    texts = list(ctx.sample_texts)
    long_text, mid_text = " ".join(texts[:20]), " ".join(texts[:8])
    unfused, fused = OrtPredictor(spec, root / "export", threads=1), OrtPredictor(spec, root / "fuse", threads=1)
    reference = TorchPredictor(spec, root / "model", threads=1)
    result["parity_fused"] = []
    for batch in ([texts[0]], [mid_text], [long_text], [long_text, texts[1]]):
        encoded = fused.tokenize(batch)
        got = fused.raw_outputs(encoded)
        result["parity_fused"].append({
            "shape": list(encoded["input_ids"].shape),
            "vs_unfused": compare(unfused.raw_outputs(encoded), got, encoded["attention_mask"]),
            "vs_torch": compare(reference.raw_outputs(encoded), got, encoded["attention_mask"]),
        })
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
