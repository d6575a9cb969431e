#!/bin/sh
# The full TruthfulQA evaluation behind results/truthfulqa/ (issue 15): all 817 questions, the six RAGSys variants
# and the lambda_d sweep with SmolLM2 (fp32, the default) and Gemma-3-270m (bf16; opt-in, see `make gemma`), the
# Fix row on v0 in fp32 (the copy lm-evaluation-harness uses), then the findings across the two LMs.
# Every stage is cached and resumable: rerun this after a kill and it continues where it stopped.
set -e
SWEEP=0,0.25,0.5,0.75,1
GEMMA_SWEEP=${GEMMA_SWEEP-$SWEEP}   # GEMMA_SWEEP= (empty): no sweep for Gemma, 30% less time
OUT=${OUT-results/truthfulqa}   # OUT=... RUN_ROOT=... sh scripts/truthfulqa_full.sh: a rerun beside the committed folder
RUN_ROOT=${RUN_ROOT-runs}
mkdir -p "$OUT"
epr truthfulqa --set run_root="$RUN_ROOT" --set name=tqa-smollm2-fp32 --set truthfulqa.sweep=$SWEEP
epr truthfulqa --set run_root="$RUN_ROOT" --set name=tqa-smollm2-fp32-v0-fix --set truthfulqa.version=v0 --set truthfulqa.variants=fix
EPR_ACCEPT_GEMMA_TERMS=1 epr truthfulqa -c configs/truthfulqa-gemma.yaml --set run_root="$RUN_ROOT" --set name=tqa-gemma-bf16 \
    --set models.dtype=bf16 --set "truthfulqa.sweep=[$GEMMA_SWEEP]"
for run in smollm2-fp32 smollm2-fp32-v0-fix gemma-bf16; do
    rm -rf "$OUT/$run" && mkdir -p "$OUT/$run"
    R="$RUN_ROOT/tqa-$run/tqa_report"
    cp "$R"/*.md "$R"/*.json "$R"/*.csv "$R"/*.png "$R"/*.html "$R"/per_question.jsonl \
       "$OUT/$run/" 2>/dev/null || true
done
python -m epr.cli truthfulqa findings "$OUT/smollm2-fp32" "$OUT/gemma-bf16" --out "$OUT/README.md"
