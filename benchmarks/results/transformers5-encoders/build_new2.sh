#!/usr/bin/env bash
set -x
export XFORMOPT_CACHE_DIR=/work/bench33/cache-new2
X=/work/venv-new/bin/xformopt
cd /work/bench33
$X optimize minilm --recipe allfused.yaml -o new-minilm --force
$X optimize sentiment-model --recipe allfused.yaml --data /work/main/xformopt/resources/vader_movie/test.jsonl -o new-sentiment --force
$X optimize mpnet --recipe allfused.yaml -o new-mpnet --force
echo BUILD-NEW2-DONE
