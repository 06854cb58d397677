#!/bin/sh
# loom-launch: rank prefixes, a failing rank ends the others and gives its status, and two
# ranks of loom_tests meet over Gloo. Usage: launch_test.sh LOOM_LAUNCH LOOM_TESTS
set -u
launch=$1 tests=$2
fail() { echo "launch_test: $*" >&2; exit 1; }

out=$("$launch" -n 2 sh -c 'echo "hello from $LOOM_RANK of $LOOM_WORLD_SIZE"') || fail "echo run failed"
echo "$out" | grep -qx '\[rank 0\] hello from 0 of 2' || fail "no rank 0 line in: $out"
echo "$out" | grep -qx '\[rank 1\] hello from 1 of 2' || fail "no rank 1 line in: $out"

out=$("$launch" -n 2 --rank-offset 2 --world-size 4 sh -c 'echo "r=$LOOM_RANK w=$LOOM_WORLD_SIZE l=$LOOM_LOCAL_RANK"')
echo "$out" | grep -qx '\[rank 3\] r=3 w=4 l=1' || fail "offset ranks wrong: $out"

start=$(date +%s)
"$launch" -n 3 sh -c 'if [ "$LOOM_RANK" = 1 ]; then exit 7; fi; sleep 60' 2>/dev/null
status=$?
took=$(( $(date +%s) - start ))
[ "$status" = 7 ] || fail "expected the failing rank's status 7, got $status"
[ "$took" -lt 10 ] || fail "the other ranks were not ended (took ${took}s)"

out=$("$launch" -n 2 --timeout 20 "$tests" --gtest_filter=DistLaunch.TwoRanksMeet) || fail "Gloo ranks failed: $out"
echo "$out" | grep -q '\[rank 1\] .*OK .*DistLaunch.TwoRanksMeet' || fail "rank 1 did not pass: $out"

# The same through a TCP store that rank 0 serves (a port free a moment ago).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$("$launch" -n 2 --timeout 20 --store "127.0.0.1:$port" "$tests" --gtest_filter=DistLaunch.TwoRanksMeet) ||
  fail "Gloo ranks over the TCP store failed: $out"
echo "$out" | grep -q '\[rank 1\] .*OK .*DistLaunch.TwoRanksMeet' || fail "rank 1 did not pass over TCP: $out"
echo "launch_test: ok"
