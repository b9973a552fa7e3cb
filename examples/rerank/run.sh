#!/usr/bin/env bash
# Train MiniLM into a cross-encoder on the vendored snippets' halves (review_rerank's task), optimize it (INT8 held to an NDCG@10
# budget), then serve it: POST /rerank (and /) answers TEI's rerank body.
# Paths are relative to the repository root; extra arguments go to train_cross_encoder.py.
# An existing examples/rerank/model is reused unless --force is passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}

if [[ -d examples/rerank/model && " $* " != *" --force "* ]]; then
    echo "reusing examples/rerank/model (pass --force to retrain)" >&2
else
    "$PYTHON" examples/rerank/train_cross_encoder.py "$@"
fi
xformopt optimize examples/rerank/model --target auto --max-accuracy-drop 1 -o examples/rerank/out --force
echo "serve it: xformopt serve examples/rerank/out   # then POST /rerank {\"query\": ..., \"texts\": [...]}" >&2
