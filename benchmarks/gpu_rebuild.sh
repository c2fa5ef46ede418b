#!/bin/bash
# A slice of the reference rebuild (issues 35, 71) on a lent GPU, in one short lease: every
# built-in task (`--task extended`: the default suite, each task at its ladder's levels, and
# the State tasks) of the mechanisms MECHS in the tracks TRACKS, packed (--pack 16, the GPU's
# default), until CAP seconds have passed; the rows it stored come back as one archive.
#     python3 -m pip install --no-deps --no-build-isolation --no-index -e . && \
#         MECHS=slay,none TRACKS="block core" CAP=480 bash benchmarks/gpu_rebuild.sh
# Then, here: tar --skip-old-files -xf <files_at>/rows.tar -C /work/runs/results (only runs
# whose lr sweep completed travel: benchmarks/keep_complete.py; a run stored here is never
# overwritten, so the two devices never share a run). Every row records its device and
# torch version. Give a GPU whole mechanisms in both tracks, so that a mechanism's
# block/core cost ratio compares one device with itself (build_reference.py's track_costs
# pairs rows of one device only).
# MECHS, TRACKS, CAP, JOBS (trainings at once, default 8 of the lease's 16 cores), TASKS
# (default extended), PROTO, DEV, ROWS, RESUME, SEED, PY and OUT change it; DEV=cpu PROTO=smoke
# MECHS=softmax CAP=60 PY=python tries it on a CPU (tests/test_gpu_rebuild.py does).
DEV=${DEV:-cuda}; PROTO=${PROTO:-quick}; CAP=${CAP:-480}; JOBS=${JOBS:-8}; TASKS=${TASKS:-extended}
MECHS=${MECHS:?name the mechanisms, e.g. MECHS=slay,none}; TRACKS=${TRACKS:-block core}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpuout}; mkdir -p $OUT
PY=${PY:-python3}
# RESUME=1 keeps ROWS: a second call on the still-warm machine finishes what the first began.
# ROWS starts from SEED (default the committed rebuild tree, which travels with the working
# tree; SEED= for none), so the GPU trains only what is missing and brings back only that.
ROWS=${ROWS:-/tmp/rebuild_rows}; [ -n "$RESUME" ] || rm -rf $ROWS
SEED=${SEED-benchmarks/runs/rebuild}; mkdir -p $ROWS
[ -z "$SEED" ] || [ ! -d "$SEED" ] || cp -rn "$SEED/." "$ROWS"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; nproc --all
  $PY -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } 2>&1 | tee $OUT/env.txt
end=$(( $(date +%s) + CAP ))
for track in $TRACKS; do
  left=$(( end - $(date +%s) ))
  [ $left -gt 10 ] || break
  echo "=== $(date -u +%FT%T) $track $MECHS (${left} s left)" | tee -a $OUT/rebuild.log
  # SIGINT first: the runner stops cleanly and keeps every run it finished
  timeout -s INT -k 30 $left $PY -m synthbench.cli run --task $TASKS --mech $MECHS --track $track \
    --protocol $PROTO --device $DEV --jobs $JOBS --threads 1 --results $ROWS 2>&1 \
    | grep --line-buffered -v "━" >> $OUT/rebuild.log
  echo "=== $track rc ${PIPESTATUS[0]}" | tee -a $OUT/rebuild.log
done
# only runs whose lr sweep is complete travel: a half run stays behind, so the CPU never
# finishes a run that a GPU began
$PY benchmarks/keep_complete.py "$ROWS" --tar "$OUT/rows.tar" ${SEED:+--except "$SEED"} 2>&1 \
  | tee -a $OUT/rebuild.log
