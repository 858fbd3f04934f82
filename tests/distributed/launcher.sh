#!/usr/bin/env bash
# scripts/kiln-run's test: three ranks meet through the rendezvous and receive rank 0's id; a
# failing rank stops the job with its status instead of leaving the others waiting.
set -u
run=$1
probe=$2
out=$("$run" -n 3 "$probe") || { echo "FAIL: kiln-run -n 3 exited $?"; exit 1; }
echo "$out"
[ "$(echo "$out" | grep -c '^rank [0-2] of 3 local [0-2] got id-of-')" = 3 ] || { echo "FAIL: three ranks"; exit 1; }
[ "$(echo "$out" | sed 's/.* got //' | sort -u | wc -l)" = 1 ] || { echo "FAIL: ranks got different ids"; exit 1; }
[ "$(echo "$out" | awk '{print $2}' | sort -u | wc -l)" = 3 ] || { echo "FAIL: ranks not distinct"; exit 1; }
start=$(date +%s)
"$run" -n 3 "$probe" fail 1
status=$?
[ "$status" = 3 ] || { echo "FAIL: a rank's status 3 came back as $status"; exit 1; }
[ $(( $(date +%s) - start )) -lt 20 ] || { echo "FAIL: the other ranks were not stopped"; exit 1; }
"$run" -n 0 "$probe" 2>/dev/null && { echo "FAIL: -n 0 accepted"; exit 1; }
echo "PASS"
