#!/usr/bin/env bash
# Old (main 9762c37: DeBERTa on the TorchScript tracer) and new (this branch: dynamo) artifacts of the same
# random-weight DeBERTa-v3 models, built with the same venv (/work/venv) and recipe (export -> fuse all -> dynamic INT8).
# BASE: a `git archive 9762c37` of main; NEW: this worktree. Each side has its own stage cache: the cache key
# does not name the family's default exporter, so the new side would reuse the old side's TorchScript export.
set -ex
BASE=${BASE:-/tmp/enc/base}; NEW=${NEW:-/work/wt-enc}; OUT=${OUT:-/tmp/enc/bench}; PY=/work/venv/bin/python
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" && cd "$OUT"
[ -d models/deb-base ] || PYTHONPATH=$NEW $PY "$HERE/make_models.py" "$OUT/models"
for m in ${MODELS:-deb-tiny deb-base}; do
  [ -n "$SKIP_OLD" ] || XFORMOPT_CACHE_DIR=$OUT/cache-old PYTHONPATH=$BASE $PY -m xformopt.cli.app optimize "$OUT/models/$m" --recipe "$HERE/allfused.yaml" -o "old-$m" --force
  XFORMOPT_CACHE_DIR=$OUT/cache-new PYTHONPATH=$NEW $PY -m xformopt.cli.app optimize "$OUT/models/$m" --recipe "$HERE/allfused.yaml" -o "new-$m" --force
done
echo BUILD-DONE
