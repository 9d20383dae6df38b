#!/bin/bash
# Usage: loop.sh LOOPS RUNS MODE. LOOPS loops side by side, RUNS runs of reproduce.py MODE each,
# under torchrun on 2 ranks; prints "MODE,runs,aborted,failed" (aborted: the output says
# "terminate called"; failed: a non-zero exit status).
loops=$1; runs=$2; mode=$3
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
one_loop() {
    for i in $(seq "$runs"); do
        torchrun --nproc-per-node 2 --master-port $((28000 + 100 * $1 + i)) "$here/reproduce.py" "$mode" \
            > "$out/$1.$i.log" 2>&1
        echo $? > "$out/$1.$i.rc"
    done
}
for l in $(seq "$loops"); do one_loop "$l" & done
wait
echo "$mode,$((loops * runs)),$(grep -l 'terminate called' "$out"/*.log | wc -l),$(grep -L '^0$' "$out"/*.rc | wc -l)"
rm -rf "$out"
