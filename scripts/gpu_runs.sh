#!/bin/bash
# On a lent GPU machine (docs/development.md), from the repository root: join the pieces scripts/gpu_payload.sh cut
# (.gpu/x*/p.*, carried one call at a time and gathered in $S), install the wheels beside the machine's own torch,
# start the runs in their own process session (they outlive this call), wait up to $LIMIT seconds, then pack what
# the device returns (scripts/gpu_pack.py: every run's record in $OUT/records.tgz, whole runs without weights in
# $OUT/run-<name>.tgz as the limits allow, the logs in $OUT/runs.tgz; PACK=0 packs nothing). A later call with the
# same RUNS starts nothing again: it installs mpnet's pieces when whole (gpu_payload.sh MPNET=1), waits on and
# packs again; runs resume stage by stage as `epr run` always does. RUNS:
# `epr run` arguments, one run per `;`:
#
#     RUNS="-c configs/mtop.yaml --set candidates.num_queries=8000 --set name=mtop-8000-gpu" \
#         LIMIT=540 bash scripts/gpu_runs.sh
#
# A lease ends with its machine, and the next one starts bare: each packing call also exports the LM scores under $R
# that no IMPORT file carries to $OUT/scores.json.gz (`epr cache export --skip`), and IMPORT="<carried file> ..."
# imports such files (every earlier lease's) before the runs start, so a run that did not finish inside one lease
# scores nothing twice in the next (its other stages rerun).
#
# The runs see --set run_root=$R and --set data.data_dir=<the payload's data>; their logs are $R/<k>.log, k counting
# runs from 0 in the order RUNS gives them. Lanes: `|` splits RUNS into chains that run side by side (one process
# each on the one GPU: the 8,000-label arm left it mostly idle), each chain in order; a run that fails ends its own
# chain only (its k is appended to $R/failed). Two lanes that score the same labels at once both score them
# (`after:` below keeps them apart).
#
#     RUNS="<run a>;<run b>|<run c>" ...      # a then b, beside c
#
# `after:PATH` in a chain is a barrier, not a run: the lane waits until $R/PATH (or an absolute PATH) exists, another
# lane's finished stage, then goes on; also once every lane that begins with a run has ended without making it, or
# after AFTER_MAX seconds (1800), or after S seconds where it says `after:PATH@S`. RUNS where every lane begins with a
# barrier is refused (exit 6). A run written `?<args>` is optional: where it fails (its k in $R/failed all the same),
# its lane goes on. mpnet's arms wait this way for its pieces, and are skipped if those do not come in time:
#
#     RUNS="<A>;after:mpnet.ok@300;?<E, mpnet>;<B>" ...
#
# Seeds that share round 1's labels score them once with a barrier: the
# score cache under $R serves them to the lanes that waited (the same values, not a second bf16 computation):
#
#     RUNS="<s42>|after:<s42's name>/rounds/round-1/scores/manifest.json;<s1>|after:<the same>;<s2>" ...
set -u; shopt -s extglob
PY=${PY:-python3}; S=${S:-/tmp/s}; T=${T:-/tmp}; R=${R:-/tmp/runs}; LIMIT=${LIMIT:-540}
mkdir -p "$S" "$R"
cp .gpu/x*/p.* .gpu/m*/m.* .gpu/m*/mpnet.sha256 "$S/" 2>/dev/null  # this call's pieces, beside the earlier calls'
if [ ! -f "$T/site.ok" ]; then
  (cd "$T" && cat "$S"/p.* > payload.tar && echo "$(cat "$OLDPWD/.gpu/payload.sha256")  payload.tar" | sha256sum -c - \
    && tar xf payload.tar && rm payload.tar) || { echo "gpu_runs: the payload is incomplete or corrupt"; exit 3; }
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$T/site" \
    "$T"/payload/whl/*.whl || exit 4
  touch "$T/site.ok"
fi
# mpnet's tar (gpu_payload.sh MPNET=1) comes in the calls after the runs start: installed once whole, then
# $R/mpnet.ok lets the lanes that wait for it (`after:mpnet.ok`) go on
if [ -f "$S/mpnet.sha256" ] && [ ! -f "$T/mpnet.ok" ]; then
  read -r sum count < "$S/mpnet.sha256"; have=$(ls "$S"/m.* | wc -l)
  if [ "$have" -lt "${count:-0}" ]; then
    echo "gpu_runs: mpnet's payload: $have of $count pieces so far"
  elif [ "$(cat "$S"/m.* | sha256sum | cut -d' ' -f1)" = "$sum" ]; then
    mkdir -p "$T/mpnet" && cat "$S"/m.* | tar xf - -C "$T/mpnet" \
      && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$T/site" \
        "$T"/mpnet/payload/whl/*.whl && touch "$T/mpnet.ok" && echo "gpu_runs: mpnet installed" \
      || echo "gpu_runs: mpnet's payload did not install"
  else
    echo "gpu_runs: mpnet's payload: all $have pieces in, but they do not match its digest (a piece damaged?)"
  fi
fi
[ -f "$T/mpnet.ok" ] && touch "$R/mpnet.ok"
# the tokenizer on every core: on a GPU the host's work per label sequence, tokenising most of it, is what the
# GPU waits on (benchmarks/results/scoring-host-*.md); `epr run` starts no forked worker (a fork would tokenise on one core)
export PYTHONPATH=$T/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-true} PYTHONUNBUFFERED=1
# the 8,000-label H200 run held 139 of 143 GB by its second arm (many batch shapes in one process): segments that grow
# instead of cached blocks of every size; the scores stage logs where its time went (prepare / lm / store)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
IFS='|' read -ra lanes <<< "${RUNS:?RUNS: epr run arguments, one run per semicolon, lanes split by |}"
if [ ! -f "$R/started" ]; then
  for f in ${IMPORT:-}; do  # scores an earlier lease computed (its $OUT/scores.json.gz, carried): not scored again
    $PY -m epr.cli cache import "$f" --set run_root="$R" || { echo "gpu_runs: cannot import $f"; exit 5; }
  done
  # the lanes that begin with a run: a barrier whose file never comes stops waiting once all of them have ended
  producers=""
  for l in "${!lanes[@]}"; do
    first="${lanes[$l]%%;*}"; first="${first#"${first%%[![:space:]]*}"}"
    [[ $first == after:* ]] || producers+="[ -e '$R/lane$l.end' ] && "
  done
  [ -n "$producers" ] || { echo "gpu_runs: every lane begins with after:, so nothing would make their files"; exit 6; }
  date -u +%FT%TZ > "$R/started"
  k=0
  for l in "${!lanes[@]}"; do
    IFS=';' read -ra runs <<< "${lanes[$l]}"
    script=""
    for r in "${runs[@]}"; do
      b="${r#"${r%%[![:space:]]*}"}"  # without leading blanks
      if [[ $b == after:* ]]; then  # a barrier, not a run: wait for a file, at most AFTER_MAX (or @) seconds
        p="${b#after:}"; p="${p%"${p##*[![:space:]]}"}"; most=${AFTER_MAX:-1800}
        [[ $p == *@+([0-9]) ]] && { most=${p##*@}; p=${p%@*}; }
        [[ $p == /* ]] || p="$R/$p"
        script+="echo 'waiting for $p'; w=\$((SECONDS + $most)); "
        script+="until [ -e '$p' ] || { ${producers}true; } || [ \$SECONDS -ge \$w ]; do sleep ${POLL:-5}; done; "
        script+="[ -e '$p' ] && echo \"\$(date -u +%FT%TZ) found $p\" || echo 'not there, and the lanes that make files have ended (or AFTER_MAX passed): going on without $p'; "
        continue
      fi
      end="touch $R/lane$l.end; exit 1"
      [[ $b == \?* ]] && { r="${b#\?}"; end="echo 'run $k failed: optional, the lane goes on'"; }
      script+="$PY -m epr.cli run $r --set run_root=$R --set data.data_dir=$T/payload/data > $R/$k.log 2>&1"
      script+=" && date -u +%FT%TZ > $R/$k.done || { echo $k >> $R/failed; $end; }; "
      k=$((k + 1))
    done
    setsid nohup bash -c "$script touch $R/lane$l.end" > "$R/driver$l.log" 2>&1 < /dev/null &
  done
fi
ended() { local n=0 l; for l in "${!lanes[@]}"; do [ -f "$R/lane$l.end" ] && n=$((n + 1)); done; echo $n; }
end=$((SECONDS + LIMIT))
while [ $SECONDS -lt $end ] && [ "$(ended)" -lt "${#lanes[@]}" ]; do sleep ${POLL:-5}; done
[ "$(ended)" -eq "${#lanes[@]}" ] && touch "$R/done"
ls "$R"; for f in "$R"/*.log; do echo "== $f"; tail -c 1500 "$f" | tr '\r' '\n' | tail -12; done
if [ -n "${OUT:-}" ] && [ "${PACK:-1}" = 1 ]; then
  if [ -d "$R/.cache/scores" ]; then  # every LM score so far, for a later lease's IMPORT (a lease ends the machine)
    skip=(); for f in ${IMPORT:-}; do skip+=(--skip "$f"); done  # what earlier leases' files carry already
    $PY -m epr.cli cache export "$OUT/scores.json.gz" "${skip[@]}" --set run_root="$R" > "$R/export.log" 2>&1 \
      && tail -1 "$R/export.log" || echo "gpu_runs: the score export failed ($R/export.log)"
  fi
  # what comes back: every run's record in records.tgz, whole runs as the device's limits on returned files allow
  # (8 files, 16 MiB each, 64 MiB together), the logs in runs.tgz (scripts/gpu_pack.py)
  "${PY%% *}" "$(dirname "$0")/gpu_pack.py" "$R" "$OUT"
  ls -la "$OUT"
fi
