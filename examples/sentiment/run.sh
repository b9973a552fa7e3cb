#!/usr/bin/env bash
# Fine-tune MiniLM on the vendored movie-review sentiment data, then optimize it with xformopt.
# Paths are relative to the repository root; extra arguments go to finetune.py.
# An existing examples/sentiment/model is reused unless --force is passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}

if [[ -d examples/sentiment/model && " $* " != *" --force "* ]]; then
    echo "reusing examples/sentiment/model (pass --force to retrain)" >&2
else
    "$PYTHON" examples/sentiment/finetune.py "$@"
fi
xformopt optimize examples/sentiment/model --target auto \
    --data xformopt/resources/vader_movie/test.jsonl -o examples/sentiment/out
