#!/bin/bash
# kvlab-tiny recipe, one command: corpus -> tokenizer -> training -> evaluation -> export.
#   data/train.sh [TRAIN_MINUTES]        (default 80; CPU, one thread)
# Re-running resumes nothing: it starts from the wired initialisation (seed 0). To continue a
# run, call data/train.py --resume directly, then the evaluate/export lines below.
set -euo pipefail
cd "$(dirname "$0")"
PY=/usr/bin/python3
MIN=${1:-80}
export MALLOC_MMAP_MAX_=0          # +40% torch CPU throughput measured on this machine
$PY corpus.py --work work --eval-dir eval
$PY train_tokenizer.py --input work/corpus/train.txt --out work/tokenizer
rm -f work/ckpt.pt work/train_log.jsonl
$PY train.py --work work --minutes "$MIN"
$PY evaluate.py --ckpt work/ckpt.pt --out models/kvlab-tiny.eval --card models/kvlab-tiny.md
$PY export.py --ckpt work/ckpt.pt --tokenizer work/tokenizer/tokenizer.model --out models --name kvlab-tiny
cp models/kvlab-tiny.md models/kvlab-tiny-hf/README.md
