#!/usr/bin/env bash
# Fine-tune MiniLM as a word-level polarity tagger on the vendored vader_polarity_tags data, then
# optimize it with xformopt. Paths are relative to the repository root; extra arguments go to finetune.py.
# An existing examples/token_polarity/model is reused unless --force is passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}

if [[ -d examples/token_polarity/model && " $* " != *" --force "* ]]; then
    echo "reusing examples/token_polarity/model (pass --force to retrain)" >&2
else
    "$PYTHON" examples/token_polarity/finetune.py "$@"
fi
xformopt optimize examples/token_polarity/model --target auto \
    --data xformopt/resources/vader_polarity_tags/test.jsonl -o examples/token_polarity/out
