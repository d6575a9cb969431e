#!/bin/sh
# The full TruthfulQA evaluation behind results/truthfulqa/ (issue 15): all 817 questions, the six RAGSys variants
# and the lambda_d sweep with SmolLM2 (fp32, the default) and Gemma-3-270m (bf16; opt-in, see `make gemma`), the
# Fix row on v0 in fp32 (the copy lm-evaluation-harness uses), then the findings across the two LMs.
# Every stage is cached and resumable: rerun this after a kill and it continues where it stopped.
set -e
SWEEP=0,0.25,0.5,0.75,1
GEMMA_SWEEP=${GEMMA_SWEEP-$SWEEP}   # GEMMA_SWEEP= (empty): no sweep for Gemma, 30% less time
OUT=results/truthfulqa
epr truthfulqa --set name=tqa-smollm2-fp32 --set truthfulqa.sweep=$SWEEP
epr truthfulqa --set name=tqa-smollm2-fp32-v0-fix --set truthfulqa.version=v0 --set truthfulqa.variants=fix
EPR_ACCEPT_GEMMA_TERMS=1 epr truthfulqa -c configs/truthfulqa-gemma.yaml --set name=tqa-gemma-bf16 \
    --set models.dtype=bf16 --set "truthfulqa.sweep=[$GEMMA_SWEEP]"
for run in smollm2-fp32 smollm2-fp32-v0-fix gemma-bf16; do
    rm -rf "$OUT/$run" && mkdir -p "$OUT/$run"
    cp runs/tqa-$run/tqa_report/*.md runs/tqa-$run/tqa_report/*.json runs/tqa-$run/tqa_report/*.csv \
       runs/tqa-$run/tqa_report/*.png runs/tqa-$run/tqa_report/*.html runs/tqa-$run/tqa_report/per_question.jsonl \
       "$OUT/$run/" 2>/dev/null || true
done
python -m epr.truthfulqa.findings "$OUT/smollm2-fp32" "$OUT/gemma-bf16" --out "$OUT/README.md"
