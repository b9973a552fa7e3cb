"""Perplexity of the converted SmolLM2 checkpoint (PyTorch fp32) and its int4 artifact on the 16 texts
benchmarks/llamacpp.py scores, and fp32 greedy chat answers.

    python ppl16_and_fp32_chat.py CONVERTED_CHECKPOINT INT4_ARTIFACT
"""
import sys
from pathlib import Path

from xformopt.decoder.perplexity import load_token_lists, perplexity
from xformopt.models import load_tokenizer
from xformopt.runtime.decoder import OrtDecoder, TorchDecoder

src = Path(sys.argv[1])
tok = load_tokenizer(src)
lists, source = load_token_lists(None, tok, None, limit=16, window=256)
print("tokens", sum(len(l) for l in lists), "texts", len(lists))
print("pytorch fp32", perplexity(TorchDecoder(src, threads=2), lists)["value"])
print("int4", perplexity(OrtDecoder(Path(sys.argv[2]), threads=2), lists)["value"])
# fp32 greedy chat answer
from transformers import AutoModelForCausalLM

m = AutoModelForCausalLM.from_pretrained(src).eval()
for q in ["What is the capital of France?", "What is the capital of Germany?"]:
    ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = m.generate(ids, max_new_tokens=24, do_sample=False)
    print("fp32:", q, "->", repr(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))
