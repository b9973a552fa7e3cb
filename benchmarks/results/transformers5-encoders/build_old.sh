#!/usr/bin/env bash
# Baseline artifacts with main before issue 33 (transformers 4.57 + optimum exporter): /work/base, /work/venv-old.
set -x
export XFORMOPT_CACHE_DIR=/work/bench33/cache-old
X=/work/venv-old/bin/xformopt
cd /work/bench33
$X optimize minilm --recipe allfused.yaml -o old-minilm --force
$X optimize mpnet --recipe allfused.yaml -o old-mpnet --force
[ -d sentiment-model ] || /work/venv-old/bin/python /work/base/examples/sentiment/finetune.py --output sentiment-model 2>&1 | tail -20
$X optimize sentiment-model --recipe allfused.yaml --data /work/base/xformopt/resources/vader_movie/test.jsonl -o old-sentiment --force
echo BUILD-OLD-DONE
