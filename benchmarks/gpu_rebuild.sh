#!/bin/bash
# A slice of the reference rebuild (issue 35) on a lent GPU, in one short lease: every
# default task of the mechanisms MECHS in the tracks TRACKS, packed (--pack 16, the GPU's
# default), until CAP seconds have passed; the rows it stored come back as one archive.
#     python3 -m pip install --no-deps --no-build-isolation --no-index -e . && \
#         MECHS=slay,none TRACKS="block core" CAP=480 bash benchmarks/gpu_rebuild.sh
# Then, here: tar --skip-old-files -xf <files_at>/rows.tar -C /work/runs/results (only runs
# whose lr sweep completed travel, and a run stored here is never overwritten, so the two
# devices never share a run). Every row records its device and torch version. Give a GPU
# whole mechanisms in both tracks, so that a mechanism's block/core cost ratio compares one
# device with itself (build_reference.py's track_costs pairs rows of one device only).
# MECHS, TRACKS, CAP, JOBS (trainings at once, default 8 of the lease's 16 cores), TASKS
# (default all), PROTO, DEV, ROWS, PY and OUT change it; DEV=cpu PROTO=smoke MECHS=softmax
# CAP=60 PY=python tries it on a CPU (tests/test_gpu_rebuild.py does).
DEV=${DEV:-cuda}; PROTO=${PROTO:-quick}; CAP=${CAP:-480}; JOBS=${JOBS:-8}; TASKS=${TASKS:-all}
MECHS=${MECHS:?name the mechanisms, e.g. MECHS=slay,none}; TRACKS=${TRACKS:-block core}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpuout}; mkdir -p $OUT
PY=${PY:-python3}
ROWS=${ROWS:-/tmp/rebuild_rows}; rm -rf $ROWS
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
$PY - "$ROWS" "$OUT/rows.tar" <<'PY' 2>&1 | tee -a $OUT/rebuild.log
import collections, sys, tarfile
from pathlib import Path
from synthbench.run.lr_selection import sweep_state
from synthbench.run.protocols import PROTOCOLS
from synthbench.run.store import ResultStore
root = Path(sys.argv[1])
store = ResultStore(root)
rows = store.load(warn=False).rows if root.is_dir() else None
if rows is None or rows.empty:
    sys.exit("no rows stored")
complete = collections.Counter()
with tarfile.open(sys.argv[2], "w") as tar:
    for run_id, run in rows.groupby("run_id"):
        protocol, task, mech = run.iloc[0][["protocol", "task", "mechanism"]]
        if sweep_state(PROTOCOLS.get(protocol), run.to_dict("records")).complete:
            path = store.file_of(protocol, task, mech, run_id)
            tar.add(path, arcname=str(path.relative_to(root)))
            complete[protocol, mech] += 1
for (protocol, mech), n in sorted(complete.items()):
    print(f"{protocol:<12} {mech:<16} {n} complete runs")
print(f"{complete.total()} complete of {rows['run_id'].nunique()} runs started; archived in {sys.argv[2]}")
PY
