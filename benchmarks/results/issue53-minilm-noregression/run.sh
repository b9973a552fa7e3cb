#!/usr/bin/env bash
# issue 53's MiniLM no-regression point: the example's sentiment classifier (finetune.py defaults), then the recipe
cd /work/main
source .venv/bin/activate
cd /work/exp/noreg
echo "finetune start $(date -u +%FT%TZ)" > run.time
[ -f model/config.json ] || python /work/main/examples/sentiment/finetune.py --output /work/exp/noreg/model > ft.log 2>&1
echo "optimize start $(date -u +%FT%TZ)" >> run.time
/usr/bin/time -v xformopt optimize /work/exp/noreg/model --recipe prune-distill-int8 --max-accuracy-drop 0.5 \
    -o /work/exp/noreg/out --force --json > run.json 2> run.err
echo "exit $? end $(date -u +%FT%TZ)" >> run.time
