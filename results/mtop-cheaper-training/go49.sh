#!/bin/bash
# Issue 49, dev only: round 2's training in bf16 autocast, and warm-started from round 1 with one epoch, against the
# fp32 two-epoch round 2 of the default MTOP recipe (the run of results/mtop-default-recipe, its labels), on 300
# held-out pool examples (select; no evaluation example is read).
set -e
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
E="{venv}/bin/python -m epr.cli"
S="--set models.dtype=fp32"
B="$S --set candidates.rounds=1 --set candidates.miner=retriever --set candidates.mine_run=mtop/rounds/round-1"
# (benchmarks.training --precision ran first: benchmarks/results/training-precision-zen4.md)
# the fp32 baseline: runs/mtop (round 2 of the default recipe) with its select on 300 pool examples, fresh
date; /usr/bin/time -v $E run -c configs/mtop.yaml $B --set train.mixed_precision=bf16 --set name=mtop-r2-bf16 --until select
cmp runs/mtop/candidates/candidates.jsonl runs/mtop-r2-bf16/candidates/candidates.jsonl && echo "round-2 candidates identical"
date; /usr/bin/time -v $E run -c configs/mtop.yaml $B --set train.mixed_precision=bf16 --set train.init=previous --set train.warm_epochs=1 --set name=mtop-r2-warm --until select
date; echo DONE
