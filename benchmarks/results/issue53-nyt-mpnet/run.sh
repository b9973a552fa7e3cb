#!/usr/bin/env bash
# issue 53's second task: MPNet-base fine-tuned on VADER's NYT editorial snippets, then the recipe at 1.0 point
cd /work/main && source .venv/bin/activate
N=/work/exp/nyt; D=$N/data
echo "finetune start $(date -u +%FT%TZ)" > $N/run.time
[ -f $N/teacher/config.json ] || python examples/sentiment/finetune.py --base mpnet --train-limit 0 --epochs 3 \
    --data-dir $D --output $N/teacher > $N/ft.log 2>&1
echo "optimize start $(date -u +%FT%TZ)" >> $N/run.time
/usr/bin/time -v xformopt optimize $N/teacher --recipe prune-distill-int8 --max-accuracy-drop 1.0 \
    --data $D/test.jsonl --train-data $D/train.jsonl --validation-data $D/validation.jsonl \
    -o $N/out --force --json > $N/run.json 2> $N/run.err
echo "exit $? end $(date -u +%FT%TZ)" >> $N/run.time
