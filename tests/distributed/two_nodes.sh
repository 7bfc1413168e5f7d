#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair (10.231.<id>.1 and .2).
# On each, `ddp_worker two_nodes` runs under fulgur's launcher with num_nodes=2 and NODE_RANK,
# MASTER_ADDR, MASTER_PORT set, as a user would start it on two hosts. Where namespaces cannot be
# made (no root, no iproute2), it says so and exits 77, which ctest reports as skipped.
set -u
worker=$1
id=$(( $$ % 200 + 20 ))
n0=fulgur_n0_$$ n1=fulgur_n1_$$
cleanup() { ip netns del "$n0" 2>/dev/null; ip netns del "$n1" 2>/dev/null; }
trap cleanup EXIT
if ! command -v ip >/dev/null || ! ip netns add "$n0" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (needs root and iproute2)"; exit 77
fi
ip netns add "$n1" || { echo "SKIPPED: cannot create a second namespace"; exit 77; }
ip link add "v0_$$" type veth peer name "v1_$$" || { echo "SKIPPED: cannot create a veth pair"; exit 77; }
ip link set "v0_$$" netns "$n0" && ip link set "v1_$$" netns "$n1"
ip -n "$n0" addr add "10.231.$id.1/24" dev "v0_$$" && ip -n "$n1" addr add "10.231.$id.2/24" dev "v1_$$"
for ns in "$n0" "$n1"; do ip -n "$ns" link set lo up; done
ip -n "$n0" link set "v0_$$" up && ip -n "$n1" link set "v1_$$" up
log=$(mktemp -d)
common=(MASTER_ADDR=10.231.$id.1 MASTER_PORT=29960 OMP_NUM_THREADS=1 FULGUR_TEST_TIMEOUT_MS=60000)
ip netns exec "$n0" env "${common[@]}" NODE_RANK=0 GLOO_SOCKET_IFNAME="v0_$$" "$worker" two_nodes >"$log/n0" 2>&1 &
p0=$!
ip netns exec "$n1" env "${common[@]}" NODE_RANK=1 GLOO_SOCKET_IFNAME="v1_$$" "$worker" two_nodes >"$log/n1" 2>&1 &
p1=$!
wait $p0; s0=$?
wait $p1; s1=$?
echo "--- node 0 (exit $s0):"; cat "$log/n0"
echo "--- node 1 (exit $s1):"; cat "$log/n1"
rm -rf "$log"
[ $s0 -eq 0 ] && [ $s1 -eq 0 ] && echo "two nodes trained"
