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
# wait for `after:mpnet.ok`, made when its last piece is in, at most 300 s), and last, while the lease lasts:
#
#     LIMIT=<the lease's seconds left, less 60> bash scripts/gpu_queue.sh
#
# A later call in the same lease (the same command) waits on and packs again. Afterwards, here:
#
#     COLLECT=<the folder the last call's files came back to> PY=<venv python> bash scripts/gpu_queue.sh
#
# keeps the lease's score export, records and logs under leases/<date>/ (commit them: the next lease imports every
# leases/*/scores.json.gz, so it scores nothing twice), and records every finished run into its plan's folder
# (the table `rec` below); a recorded run then leaves the queue by itself. SMOKE=1 tries each queued run, shrunk,
# on this machine before a lease; DRY_RUN=1 prints the queue. MPNET=0 leaves mpnet's arms out (a lease too short
# to carry its 13 pieces: they would only wait their 300 s).
#   1. results/mtop-8000-locked (PLAN amendment 3): seed 2, whole on the GPU, round 1's labels imported.
#   2. results/smcalflow-recipe-choices (PLAN amendment 3): A, E, B; B failed the walk's rule: C and D do not run.
#   3. results/break-recipe-choices (PLAN amendments 3 and 7): A, E, B (4,000 labels with mpnet).
#   4. results/mtop-recipe-choices (PLAN amendment 6): D2, mpnet at 8,000 labels, after its MiniLM arm on the same GPU.
#   5. results/mtop-reward-dev (PLAN amendment 1): L50, the default recipe with the paper's 50 candidates (issue 74).
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
# an mpnet arm waits for mpnet's pieces (carried after the start) at most 5 minutes after the arm before it, and is
# optional: skipped or failed, its lane goes on to the next arm, and it waits in this queue for the next lease
wait='after:mpnet.ok@300'
# seed 2 trains as seeds 42 and 1 did (4 length buckets, then the default everywhere; a GPU's default is now 1)
lane1="$mtop --set train.seed=2 --set train.length_buckets=4 --set name=mtop-8000-locked-s2"
lane2="$smc $oracle --set name=smc-1000;$wait;?$smc $mpnet --set name=smc-1000-mpnet"
lane2+=";$smc --set candidates.num_queries=2000 --set name=smc-2000"  # the walk stopped here (its PLAN's rule)
lane3="$brk $oracle --set name=break-2000;$wait;?$brk $mpnet --set name=break-2000-mpnet"
lane3+=";$wait;?$brk $mpnet --set candidates.num_queries=4000 --set name=break-4000-mpnet"  # B (amendment 7): recorded; rule B failed, the walk ends here
lane4="$dev --set name=mtop-8000;$wait;?$dev $mpnet --set name=mtop-8000-mpnet"
# issue 74 (results/mtop-reward-dev, amendment 1): the paper's L = 50 candidates, the reward model's modes among them
lane5='-c configs/mtop.yaml --set candidates.L=50 --set "retrieve.retrievers=[bm25,epr,hybrid,epr+rm,hybrid+rm]"'
lane5+=' --set "select.retrievers=[epr,hybrid,epr+rm,hybrid+rm]" --set select.weigh=logprob+em --set name=mtop-l50'
# where each run is recorded (its plan's `epr experiment record`): the results folder, the part, the side's name.
# A run whose rows are there already has left the queue (and the barrier before it): COLLECT below records them.
declare -A rec=([mtop-8000-locked-s2]="mtop-8000-locked locked s2" [mtop-8000]="mtop-recipe-choices dev r8000gpu2"
  [mtop-8000-mpnet]="mtop-recipe-choices dev r8000mpnet" [smc-1000-mpnet]="smcalflow-recipe-choices dev r1000mpnet"
  [break-2000-mpnet]="break-recipe-choices dev r2000mpnet" [break-2000]="break-recipe-choices dev r2000"
  [break-4000-mpnet]="break-recipe-choices dev r4000mpnet" [mtop-l50]="mtop-reward-dev dev l50")
for n in 1000 2000; do rec[smc-$n]="smcalflow-recipe-choices dev r$n"; done
# arms whose labels may be scored over sessions on more than one bf16 CPU (BREAK's PLAN amendment 8), with the
# committed label files (in the arm's results folder) of the arms they build on, imported before each session
declare -A moves=([break-4000-mpnet]="scores-r2000-zen4.json.gz scores-r2000mpnet-zen4.json.gz")
results=${RESULTS:-results}
name_of() { grep -oE -- '--set name=[^ "]+' <<< "$1" | tail -1 | cut -d= -f2; }
recorded() { local r; read -ra r <<< "${rec[$1]:-}"; [ -n "${r[0]:-}" ] && [ -e "$results/${r[0]}/rows/per_query-${r[2]}.jsonl.gz" ]; }
pending() {  # the lane without its recorded runs
  local out=() held="" s steps
  IFS=';' read -ra steps <<< "$1"
  for s in "${steps[@]}"; do
    if [[ $s == after:* ]]; then held=$s; continue; fi
    if [[ ${MPNET:-1} == 0 && $s == *models.encoder=mpnet* ]]; then held=""; continue; fi  # a lease without it
    if ! recorded "$(name_of "$s")"; then [ -n "$held" ] && out+=("$held"); out+=("$s"); fi
    held=""
  done
  local IFS=';'; echo "${out[*]}"
}
queue=""; for l in "$lane1" "$lane2" "$lane3" "$lane4" "$lane5"; do p=$(pending "$l"); [ -n "$p" ] && queue+="${queue:+|}$p"; done
# every earlier lease's scores (IMPORT= imports none): the first lease's, and each one COLLECT kept since
leases=${LEASES:-leases}
imports=(results/mtop-8000-locked/scores-h200.json.gz); for f in "$leases"/*/scores.json.gz; do [ -f "$f" ] && imports+=("$f"); done
export IMPORT="${IMPORT-${imports[*]}}"
export RUNS="${RUNS:-$queue}"
if [ -n "${COLLECT:-}" ]; then
  # After a lease, here: COLLECT=<the folder its files came back to>. Keeps the lease's score export, records and
  # logs under leases/<date>/ (commit them; add the scores file to IMPORT above), unpacks its runs under
  # $COLLECT_ROOT, and records each finished run of the table above into its results folder (then check and commit)
  day=$(date -u +%F); keep=$leases/$day; root=${COLLECT_ROOT:-runs/lease-$day}
  mkdir -p "$keep" "$root"
  for f in scores.json.gz records.tgz runs.tgz; do [ -f "$COLLECT/$f" ] && cp "$COLLECT/$f" "$keep/"; done
  for f in "$COLLECT"/records.tgz "$COLLECT"/run-*.tgz; do [ -f "$f" ] && tar xzf "$f" -C "$root"; done
  for d in "$root"/*/*/; do
    n=$(basename "$d"); read -ra r <<< "${rec[$n]:-}"
    [ -n "${r[0]:-}" ] || { echo "collect: $n is not in the queue's table: not recorded"; continue; }
    ev=evaluate; [ "${r[1]}" = locked ] && ev=locked/evaluate
    if [ ! -f "$d/$ev/manifest.json" ]; then echo "collect: $n did not finish: not recorded"; continue; fi
    if recorded "$n"; then echo "collect: $n is recorded already"; continue; fi
    ${PY:-python3} -m epr.cli experiment record "${d%/}" "$results/${r[0]}" --part "${r[1]}" --as "${r[2]}" \
      && echo "collect: $n recorded as ${r[2]} in $results/${r[0]}" || echo "collect: $n FAILED to record"
  done
  echo "collect: kept $(ls "$keep" | tr '\n' ' ')in $keep (commit it: the next lease imports its scores)"
  exit 0
fi
if [ -n "${HERE:-}" ]; then
  # HERE=<a queued run's name>: that run on this machine, whole, when no GPU is lent (each plan's amendment 5: a CPU
  # whose `models.dtype: auto` is bf16, never an AVX2-only CPU; start it from its own worktree, with RESULTS=<main's
  # results folder>), under run root R (runs). Then its labels go beside its results folder
  # (scores-<side>-$MACHINE.json.gz: a GPU's later arms read them with scoring.accept_devices=[cpu]) and the run is
  # recorded there, as COLLECT records a lease's runs. DTYPE overrides what `auto` resolves to here. The same
  # command in a later session resumes the arm where it stopped (amendment 6), on the CPU it started on only; an
  # arm in `moves` above, on any bf16 CPU, its labels carried between sessions in parts (BREAK's amendment 8).
  step=""; IFS='|;' read -ra all <<< "$lane1;$lane2;$lane3;$lane4;$lane5"
  for s in "${all[@]}"; do [[ $s != after:* && $(name_of "$s") == "$HERE" ]] && step=${s#\?}; done
  [ -n "$step" ] || { echo "gpu_queue: HERE=$HERE is no queued run's name"; exit 2; }
  read -ra r <<< "${rec[$HERE]}"
  if recorded "$HERE"; then echo "gpu_queue: $HERE is recorded already in $results/${r[0]}"; exit 0; fi
  py=${PY:-python3}; root=${R:-runs}
  dtype=${DTYPE:-$($py -c 'from epr.lm.identity import resolve_dtype; print(resolve_dtype("auto"))')}
  if [ "$dtype" != bf16 ]; then
    echo "gpu_queue: this machine labels in $dtype under auto: the plans run an arm on a CPU only in bf16"; exit 2
  fi
  step+=" --set run_root=$root"
  [ "${DRY_RUN:-0}" = 1 ] && { echo "epr run $step"; exit 0; }
  # one device an arm (amendment 6): its start stamps this CPU; a later session resumes it only on the same CPU
  # (name, generation, bf16 instructions, torch). DEVICE overrides the stamp.
  here=${DEVICE:-$($py -c 'from epr.reports.machine import machine, stamp; print(stamp(machine()))')}
  mkdir -p "$root"; stamp=$root/$HERE.device; side=$results/${r[0]}
  if [ -n "${moves[$HERE]+x}" ]; then
    # amendment 8: the stamp lists every CPU the arm ran on; the labels it builds on and its own earlier sessions'
    # parts are imported first (an import keeps what the cache holds already). PART=1, once a session's run has
    # stopped: its new labels so far, without those of the files before them, as the next part (commit it)
    grep -qxF "$here" "$stamp" 2>/dev/null || echo "$here" >> "$stamp"
    held=(); for f in ${moves[$HERE]}; do held+=("$side/$f"); done
    parts=0; for f in "$side/scores-${r[2]}-part"*.json.gz; do [ -f "$f" ] && held+=("$f") && parts=$((parts + 1)); done
    if [ "${PART:-0}" = 1 ]; then
      part=$side/scores-${r[2]}-part$((parts + 1))-${MACHINE:-cpu}.json.gz
      eval "$py -m epr.cli cache export $part $step --this-lm $(printf -- '--skip %q ' "${held[@]}")"
      echo "gpu_queue: $HERE's labels so far are in $part (commit it: the next session imports it)"; exit 0
    fi
    for f in "${held[@]}"; do eval "$py -m epr.cli cache import $f $step"; done
  else
    [ -f "$stamp" ] || echo "$here" > "$stamp"
    if [ "$(cat "$stamp")" != "$here" ]; then
      echo "gpu_queue: $HERE started on '$(cat "$stamp")', and this machine is '$here': an arm keeps one device."
      echo "  Carry its labels to a GPU instead: epr cache export <file> $step --this-run"; exit 2
    fi
  fi
  eval "$py -m epr.cli run $step"
  eval "$py -m epr.cli cache export $side/scores-${r[2]}-${MACHINE:-cpu}.json.gz $step --this-run"
  $py -m epr.cli experiment record "$root/$HERE" "$side" --part "${r[1]}" --as "${r[2]}"
  echo "gpu_queue: $HERE recorded as ${r[2]} in $side (check it, then commit the folder)"
  exit 0
fi
[ -n "$RUNS" ] || { echo "gpu_queue: every queued run is recorded: nothing to run"; exit 0; }
if [ "${DRY_RUN:-0}" = 1 ]; then echo "IMPORT=$IMPORT"; tr '|;' '\n\n' <<< "$RUNS"; exit 0; fi
if [ "${SMOKE:-0}" = 1 ]; then
  # Before a lease, on this machine: each distinct queued run, shrunk (64 labels, a 2,000-row pool, 8 compared
  # examples, the dev part: a smoke run reads no locked example), one after another under $SMOKE_ROOT, so that a
  # setting, task, model or retriever that fails does so here and not in a lease's lane. Label counts collapse to
  # one run; what the GPU alone does (its kernels, its sizes) stays untried: tests/test_cuda.py on a lease.
  root=${SMOKE_ROOT:-runs/smoke}; small='--set candidates.num_queries=64 --set train.dev_size=8 --set reward.dev_size=8'
  small+=' --set data.pool_limit=2000 --set data.eval_part=dev --set retrieve.eval_limit=8 --set select.size=16'
  small+=' --set generate.max_new_tokens=32'
  mkdir -p "$root"; declare -A seen; fails=0
  while IFS= read -r r; do
    [[ -z $r || $r == after:* ]] && continue; r=${r#\?}
    key=$(sed -E 's/--set (name|candidates\.num_queries|data\.eval_part|train\.seed|train\.length_buckets)=[^ ]*//g' <<< "$r" | tr -s ' ')
    [ -n "${seen[$key]:-}" ] && continue; seen[$key]=1
    name=$(name_of "$r")
    echo "smoke: $name"
    if eval "${PY:-python3} -m epr.cli run $r $small --set run_root=$root" > "$root/$name.log" 2>&1 < /dev/null; then
      echo "smoke: $name passed"
    else
      echo "smoke: $name FAILED: $root/$name.log"; tail -5 "$root/$name.log"; fails=$((fails + 1))
    fi
  done < <(tr '|;' '\n\n' <<< "$RUNS")
  exit $((fails > 0))
fi
exec bash scripts/gpu_runs.sh
