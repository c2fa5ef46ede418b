#!/bin/bash
# The reference rebuild (issues 35, 71) on this CPU, one stream: every built-in task (`--task
# extended`: the default suite, each task at its ladder's levels, and the State tasks) of each
# TRACK:MECH given (or only TASKS, a comma list, of a TRACK:MECH:TASKS), in order, one
# training at a time on one thread, into RESULTS (kept outside the work tree; a stopped
# stream resumes its training from RESULTS/.checkpoints).
#     (setsid bash benchmarks/cpu_rebuild.sh core:softmax block:deltanet >> logA.txt 2>&1 &)
# Two streams fill this 2-core machine. At the end of a session, copy the complete runs into
# the committed tree, so that a lost machine loses at most the trainings under way:
#     python benchmarks/keep_complete.py $RESULTS --into benchmarks/runs/rebuild
# and on a new machine, first: mkdir -p $RESULTS && cp -rn benchmarks/runs/rebuild/. $RESULTS
# RESULTS (default /work/runs/results), PROTO (default quick) and PY change it.
RESULTS=${RESULTS:-/work/runs/results}; PROTO=${PROTO:-quick}; PY=${PY:-python3}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
for pair in "$@"; do
  IFS=: read -r track mech tasks <<< "$pair"
  echo "=== $(date -u +%FT%T) $track $mech ${tasks:-extended}"
  $PY -m synthbench.cli run --task "${tasks:-extended}" --mech "$mech" --track "$track" --protocol "$PROTO" \
    --device cpu --jobs 1 --threads 1 --results "$RESULTS" 2>&1 | grep --line-buffered -v "━"
  echo "=== $(date -u +%FT%T) $track $mech rc ${PIPESTATUS[0]}"
done
