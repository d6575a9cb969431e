#!/bin/bash
# The work waiting for a lent GPU (issue 48), as one scripts/gpu_runs.sh call: the pre-registered runs whose plans
# put them on a GPU, each lane a chain of runs in its plan's order. Prepare the payload with every task and mpnet:
#
#     MPNET=1 PY=/work/venv/bin/python bash scripts/gpu_payload.sh mtop smcalflow break
#
# carry the core pieces one call each (`mkdir -p /tmp/s && cp .gpu/x*/p.* /tmp/s/`); the call with the last one
# (carrying .gpu/payload.sha256 too) starts the lanes and returns at once:
#
#     LIMIT=0 PACK=0 bash scripts/gpu_queue.sh
#
# then carry mpnet's pieces one call each (.gpu/mK) with that same command (the lanes run meanwhile; mpnet's arms
# wait for `after:mpnet.ok`, made when its last piece is in), and last, while the lease lasts:
#
#     LIMIT=<the lease's seconds left, less 60> bash scripts/gpu_queue.sh
#
# A later call in the same lease (the same command) waits on and packs again. What a lease scored comes back in
# $OUT/scores.json.gz: commit it under results/<folder>/ and add it to IMPORT below, so the next lease scores
# nothing twice; every run's record comes back in $OUT/records.tgz (record what finished with `epr experiment
# record`, and take it out of the lanes), whole runs in $OUT/run-<name>.tgz as the device's limits allow.
#   1. results/mtop-8000-locked (PLAN amendment 3): seed 2, whole on the GPU, round 1's labels imported.
#   2. results/smcalflow-recipe-choices (PLAN amendment 3): A, E, B, C, D.
#   3. results/break-recipe-choices (PLAN amendment 3): A, E, B.
#   4. results/mtop-recipe-choices (PLAN amendment 6): D2, mpnet at 8,000 labels, after its MiniLM arm on the same GPU.
# The lanes share the GPU. On the H200 a scoring process's torch reserved about 5 GB (its scores log says);
# what filled the GPU was jax, which bm25s started at import, now kept off it (cfefc1b). Four lanes side by side
# on an 80 GB H100 are untried: a lane that fails (its number in $R/failed, its log $R/<k>.log) ends alone, and the
# same command in the next call resumes it.
set -euo pipefail  # lower-case names here: gpu_runs.sh reads S, T, R, PY from the environment
cd "$(dirname "$0")/.."
mtop='-c configs/mtop.yaml --set candidates.num_queries=8000 --set data.eval_part=locked'
smc='-c configs/smcalflow.yaml'
brk='-c configs/break.yaml'
dev='-c configs/mtop.yaml --set candidates.num_queries=8000'
oracle='--set "retrieve.retrievers=[bm25,sbert,epr,hybrid,lm-oracle]"'
mpnet='--set models.encoder=mpnet --set "retrieve.retrievers=[epr,hybrid]"'
lane1="$mtop --set train.seed=2 --set name=mtop-8000-locked-s2"
lane2="$smc $oracle --set name=smc-1000;after:mpnet.ok;$smc $mpnet --set name=smc-1000-mpnet"
for n in 2000 4000 8000; do lane2+=";$smc --set candidates.num_queries=$n --set name=smc-$n"; done
lane3="$brk $oracle --set name=break-2000;after:mpnet.ok;$brk $mpnet --set name=break-2000-mpnet"
lane3+=";$brk --set candidates.num_queries=4000 --set name=break-4000"
lane4="$dev --set name=mtop-8000;after:mpnet.ok;$dev $mpnet --set name=mtop-8000-mpnet"
export IMPORT="${IMPORT-results/mtop-8000-locked/scores-h200.json.gz}"  # IMPORT= imports none
export RUNS="${RUNS:-$lane1|$lane2|$lane3|$lane4}"
if [ "${DRY_RUN:-0}" = 1 ]; then echo "IMPORT=$IMPORT"; tr '|;' '\n\n' <<< "$RUNS"; exit 0; fi
exec bash scripts/gpu_runs.sh
