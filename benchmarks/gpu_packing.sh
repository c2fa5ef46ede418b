#!/bin/bash
# Packed training on a GPU, in one short lease (docs/BENCHMARKS.md, "Packed training"):
# benchmarks/packed_throughput.py on copy and kv_recall, then the main job (softmax, quick,
# --task all) packed (--pack 16) and one training at a time (--pack 1), each under a time cap;
# writes env.txt, packed.{log,json}, main{16,1}.log, main.txt (wall times) and main_rows.csv
# (every lr row of both) under $OUT.
#     python3 -m pip install --no-deps --no-build-isolation --no-index -e . && bash benchmarks/gpu_packing.sh
# DEV, PROTO, TASKS, MECHS, CAP1 (seconds for the throughput part), CAP2 (per main-job leg),
# PY and OUT change it; DEV=cpu PROTO=smoke TASKS=copy,sort PY=python tries it on a CPU.
DEV=${DEV:-cuda}; PROTO=${PROTO:-quick}; CAP1=${CAP1:-150}; CAP2=${CAP2:-140}; TASKS=${TASKS:-all}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpuout}; mkdir -p $OUT
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  $PY -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"; } 2>&1 | tee $OUT/env.txt
timeout $CAP1 $PY benchmarks/packed_throughput.py --protocol $PROTO --tasks copy,kv_recall --mechs ${MECHS:-softmax,slay} \
  --members 6 --steps 50 --repeats 2 --device $DEV --out $OUT/packed.json 2>&1 | tee $OUT/packed.log
for pack in 16 1; do
  rm -rf /tmp/main$pack; s=$(date +%s.%N)
  timeout $CAP2 $PY -m synthbench.cli run --task $TASKS --mech softmax --protocol $PROTO --device $DEV --pack $pack \
    --results /tmp/main$pack 2>&1 | grep -v "━" > $OUT/main$pack.log
  echo "pack $pack rc $? wall $($PY -c "import time;print(round(time.time()-$s,1))")" | tee -a $OUT/main.txt
done
$PY - "$OUT" <<'PY'
import sys, pandas as pd
from pathlib import Path
from synthbench.run.store import ResultStore
legs = [(pack, Path(f"/tmp/main{pack}")) for pack in (16, 1)]
d = pd.concat(ResultStore(tree).load(warn=False).rows.assign(pack=pack) for pack, tree in legs if tree.is_dir())
cols = ["pack", "task", "seed", "lr", "selected", "status", "steps_done", "token_acc", "target_metric", "wall_seconds", "device"]
d[cols].sort_values(["task", "seed", "lr", "pack"]).to_csv(sys.argv[1] + "/main_rows.csv", index=False)
print(d.groupby("pack").agg(trainings=("lr", "size"), wall=("wall_seconds", "sum"), tasks=("task", "nunique")))
PY
