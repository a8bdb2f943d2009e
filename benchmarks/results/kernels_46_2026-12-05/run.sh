#!/bin/bash
# #46 before/after at S, B, DLE (with pytorch-forecasting and Darts beside), and the compile table
. /work/main/.venv/bin/activate
OUT=/tmp/bench46
after() { (cd /work/main && python benchmarks/bench_tft.py "$@"); }
before() { (cd /tmp/before && PYTHONPATH=/tmp/before/src:/tmp/before/serve/src python benchmarks/bench_tft.py "$@"); }
run() { # name side args...
  local name=$1 side=$2; shift 2
  echo "== $name $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/progress.log
  $side "$@" > $OUT/$name.$side.log 2>&1
  tail -1 $OUT/$name.$side.log | sed "s/^/$name $side /" >> $OUT/results.jsonl
}
# the compile table first (ours alone, S)
run S_eager after --config S --theirs none --repeats 3
run S_compile after --config S --theirs none --repeats 3 --compile
run S_compile_nokernels after --config S --theirs none --repeats 3 --compile --no-kernels
run S_eager_nokernels after --config S --theirs none --repeats 3 --no-kernels
# before / after, alternated
run S after --config S --theirs pf,darts --repeats 3
run S before --config S --theirs pf,darts --repeats 3
run DLE after --config DLE --theirs pf,darts --steps 2 --eval-batches 2 --repeats 1
run DLE before --config DLE --theirs pf,darts --steps 2 --eval-batches 2 --repeats 1
run B after --config B --lean --steps 2 --eval-batches 1 --repeats 1
run B before --config B --lean --steps 2 --eval-batches 1 --repeats 1
echo "== done $(date +%T)" >> $OUT/progress.log
