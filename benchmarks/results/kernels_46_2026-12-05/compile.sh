#!/bin/bash
# eager / compiled, with and without the kernels, S, ours alone; 3 rounds alternated; every
# compiled run on an empty inductor cache (a first run's compile time)
. /work/main/.venv/bin/activate
cd /work/main
OUT=/tmp/bench46
for round in 1 2 3; do
  for v in eager compile compile_nokernels eager_nokernels; do
    args="--config S --theirs none --repeats 3"
    case $v in compile) args="$args --compile";; compile_nokernels) args="$args --compile --no-kernels";; eager_nokernels) args="$args --no-kernels";; esac
    echo "== $v $round $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/compile_progress.log
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python benchmarks/bench_tft.py $args > $OUT/c_$v.$round.log 2>&1
    tail -1 $OUT/c_$v.$round.log | sed "s/^/c_$v r$round /" >> $OUT/compile.jsonl
  done
done
echo "== done $(date +%T)" >> $OUT/compile_progress.log
