#!/bin/bash
# RETRO's evidence run on one GPU (session 19: an H200, 6 min of training, 20 s of evaluation): held-out KJV books,
# the World English Bible in the database, a GPT-2 base and two RETROs from scratch (A: plain, B: the noisy copy
# curriculum for the first third of the steps), the three trained side by side on the one GPU, then evaluated.
#
#   bash examples/retro_bible_gpu.sh [OUTPUT_DIR]        # default outputs/retro_bible_gpu; rerun to resume
#
# The data and scaling stages run first, on the CPU (MiniLM keys for 59,861 chunks: ~20 min on 2 busy cores); the
# training and evaluate stages read neither the keys nor MiniLM, so OUTPUT_DIR/a may be copied to a GPU machine without
# keys.safetensors and database/index/ (how session 19 ran it). Results: OUTPUT_DIR/{a,b}/results.json; B is the
# run of docs/retro.md and examples/results/retro_bible_gpu.json. DEVICE=cpu runs it all on the CPU (days on 2 cores).
set -eu
OUT=${1:-outputs/retro_bible_gpu}; DEVICE=${DEVICE:-cuda}; PY=${PY:-python}; STEPS=${STEPS:-2400}
DATA="--corpus bible --held-out-every 8 --eval-tokens 2048 --max-page-tokens 100000"
MODEL="--hidden-size 384 --layers 6 --heads 6 --cca-layers 1,2,3,4,5 --encoder-hidden-size 384 --batch-size 32
       --dropout 0.1 --base-learning-rate 1e-3 --scratch-learning-rate 1e-3 --retro-steps 0"
COPY="--copy-steps $((STEPS / 3)) --copy-fraction 0.5 --copy-shift 16 --copy-drop 0.15"
run() { $PY examples/retro_factbook.py $DATA $MODEL --base-steps $STEPS --scratch-steps $STEPS "$@"; }
run --output-dir $OUT/a --stage data
run --output-dir $OUT/a --stage scaling
mkdir -p $OUT/a $OUT/b  # B shares A's data and base model
A=$(cd $OUT/a && pwd)
for name in corpus.json tokens.safetensors tokenizer database neighbours.safetensors scaling.safetensors base; do
  [ -e $OUT/b/$name ] || [ -L $OUT/b/$name ] || ln -s "$A/$name" $OUT/b/$name
done
run --output-dir $OUT/a --stage base --device $DEVICE --threads 4 &
run --output-dir $OUT/a --stage scratch --device $DEVICE --threads 4 &
run --output-dir $OUT/b --stage scratch --device $DEVICE --threads 4 $COPY &
wait
run --output-dir $OUT/a --stage evaluate --device $DEVICE
run --output-dir $OUT/b --stage evaluate --device $DEVICE $COPY
