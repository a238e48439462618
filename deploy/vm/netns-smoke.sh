#!/usr/bin/env bash
# The multi-VM layout of deploy/vm/README.md on one machine: one network
# namespace per "VM", each role started from its guide config with only its
# paths changed, haproxy in front of the gateways, the aws CLI in a client
# namespace; then the deployment smoke steps (deploy/smoke/steps.sh), then
# the guide's steps 10 and 11 (vm_ops: a datanode added, a failed meta VM
# replaced; NETNS_OPS=0 skips them).
#
#   sudo deploy/vm/netns-smoke.sh SLUICE_BINARY [3-vm|6-vm]     (default 6-vm)
#
# Needs root, ip (iproute2), mkfs.xfs (xfsprogs), haproxy and aws. Nothing
# on the host network is touched: the bridge lives in its own namespace and
# every address (the guide's 10.0.0.0/24) exists only inside the run's
# namespaces. Names carry the run id (NETNS_ID, default the pid), so two runs
# never collide. Datanode data dirs are loop-mounted XFS images.
# Everything (processes, mounts, loop devices, namespaces, the work dir) is
# removed on exit, failure or not; on failure the logs are kept and named.
#
# Sourced with NETNS_LIB=1 it only defines the functions (vm_setup,
# vm_start, vm_stop, vm_cut_host, ...) for other drivers, e.g. chaos tests.
set -euo pipefail

VM_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_REPO=$(cd "$VM_HERE/../.." && pwd)

# ---- state ---------------------------------------------------------------
VM_ID=${NETNS_ID:-$$}
VM_PREFIX="sl${VM_ID}"
VM_BR_NS="${VM_PREFIX}-br"
VM_CLIENT_NS="${VM_PREFIX}-client"
VM_CLIENT_IP=10.0.0.100
VM_LB_IP=10.0.0.10
VM_WORK=""
VM_HOSTS=()   # host names of the layout, in order
VM_META_ENDPOINTS=""
VM_PROCS=()   # process names "<host>/<role>" (role = config file stem)
declare -A VM_HOST_IP=() VM_HOST_IDX=()

vm_log() { printf '[netns %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
vm_die() { vm_log "FAIL: $*"; return 1; }

vm_ns() { echo "${VM_PREFIX}-$1"; }

# ---- namespaces ----------------------------------------------------------
# vm_add_ns NS IP: a namespace with loopback up and eth0 (IP/24) on the bridge.
vm_add_ns() {
    local ns=$1 ip=$2 idx=$3
    ip netns add "$ns"
    echo "$ns" >>"$VM_WORK/netns"
    ip -n "$ns" link set lo up
    ip -n "$VM_BR_NS" link add "v$idx" type veth peer name eth0 netns "$ns"
    ip -n "$VM_BR_NS" link set "v$idx" master br0 up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
}

# vm_cut_host HOST / vm_heal_host HOST: take the host's link off / back on
# the bridge (its processes keep running, unreachable: a network partition).
vm_cut_host() { ip -n "$VM_BR_NS" link set "v${VM_HOST_IDX[$1]}" down; }
vm_heal_host() { ip -n "$VM_BR_NS" link set "v${VM_HOST_IDX[$1]}" up; }

# ---- processes -----------------------------------------------------------
vm_pidfile() { echo "$VM_WORK/run/${1//\//__}.pid"; }
vm_logfile() { echo "$VM_WORK/logs/${1//\//__}.log"; }

# vm_role NAME: meta, datanode or gateway, from "<host>/<role>[-N]".
vm_role() { local r=${1#*/}; echo "${r%%-*}"; }

# vm_start NAME: starts "<host>/<stem>" from its rewritten config in the
# host's namespace; the log is appended to (restarts keep the history).
vm_start() {
    local name=$1 host=${1%%/*} stem=${1#*/} role
    role=${stem%%-*}
    ip netns exec "$(vm_ns "$host")" env NO_COLOR=1 "$VM_BIN" "$role" --config "$VM_WORK/$host/etc/$stem.toml" \
        >>"$(vm_logfile "$name")" 2>&1 &
    echo $! >"$(vm_pidfile "$name")"
}

# vm_stop NAME [SIGNAL]: SIGTERM (or SIGNAL) and wait for the exit; SIGKILL
# after 40 s (the gateway's shutdown_grace is 30 s).
vm_stop() {
    local name=$1 sig=${2:-TERM} pidfile pid i
    pidfile=$(vm_pidfile "$name")
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    kill -s "$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 400); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        vm_log "$name did not stop in 40 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

vm_running() { local f; f=$(vm_pidfile "$1"); [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

# vm_metrics_url NAME: http://<host ip>:<metrics port> from its config.
vm_metrics_url() {
    local host=${1%%/*} stem=${1#*/} port
    port=$(sed -n 's/^metrics_listen *= *"[^"]*:\([0-9]*\)".*/\1/p' "$VM_WORK/$host/etc/$stem.toml")
    echo "http://${VM_HOST_IP[$host]}:$port"
}

# vm_ready NAME: its /health/ready answers 200 (asked from the client namespace).
vm_ready() {
    ip netns exec "$VM_CLIENT_NS" "$VM_BIN" health --url "$(vm_metrics_url "$1")" >/dev/null 2>&1
}

# vm_wait_ready NAME... : each is ready within 120 s, else fail.
vm_wait_ready() {
    local name i
    for name in "$@"; do
        for i in $(seq 1 240); do
            vm_running "$name" || vm_die "$name exited: $(tail -n 5 "$(vm_logfile "$name")")"
            vm_ready "$name" && break
            sleep 0.5
        done
        # Ready, and by this process (not a leftover holding the port).
        vm_running "$name" || vm_die "$name exited: $(tail -n 5 "$(vm_logfile "$name")")"
        vm_ready "$name" || vm_die "$name not ready after 120 s: $(ip netns exec "$VM_CLIENT_NS" "$VM_BIN" health --url "$(vm_metrics_url "$name")")"
    done
}

vm_procs_of() { local p; for p in "${VM_PROCS[@]}"; do [ "$(vm_role "$p")" = "$1" ] && echo "$p"; done; true; }
vm_first_of() { local p; for p in "${VM_PROCS[@]}"; do [ "$(vm_role "$p")" = "$1" ] && { echo "$p"; return 0; }; done; return 1; }
vm_procs_on() { local p; for p in "${VM_PROCS[@]}"; do [ "${p%%/*}" = "$1" ] && [ "$(vm_role "$p")" = datanode ] && echo "$p"; done; true; }

# Bootstrap order of the guide: meta voters (the lowest id initializes the
# cluster), then datanodes, then gateways; each group ready before the next.
vm_start_all() {
    local p group
    for group in meta datanode gateway; do
        mapfile -t group_procs < <(vm_procs_of "$group")
        for p in "${group_procs[@]}"; do vm_start "$p"; done
        vm_wait_ready "${group_procs[@]}"
        vm_log "${#group_procs[@]} $group ready"
    done
}

vm_stop_all() {
    local p group stoppers
    for group in gateway datanode meta; do
        stoppers=()
        for p in $(vm_procs_of "$group"); do
            vm_stop "$p" &
            stoppers+=($!)
        done
        # Only these: a bare `wait` would wait for every running role too.
        wait "${stoppers[@]}"
    done
}

vm_start_haproxy() {
    ip netns exec "$(vm_ns lb)" haproxy -db -f "$VM_WORK/haproxy.cfg" >>"$VM_WORK/logs/haproxy.log" 2>&1 &
    echo $! >"$VM_WORK/run/haproxy.pid"
}

# ---- setup and teardown --------------------------------------------------
# vm_setup LAYOUT: namespaces, certificates, configs, XFS data dirs.
vm_setup() {
    local layout=$1 dir="$VM_HERE/$1" host ip _roles idx=0 f stem
    [ -d "$dir" ] || vm_die "no layout $dir"
    VM_WORK=$(mktemp -d "/tmp/sluice-netns-$VM_ID.XXXXXX")
    mkdir -p "$VM_WORK/run" "$VM_WORK/logs" "$VM_WORK/img"
    : >"$VM_WORK/netns"; : >"$VM_WORK/mounts"
    vm_log "layout $layout, work dir $VM_WORK, namespaces ${VM_PREFIX}-*"

    ip netns add "$VM_BR_NS"
    echo "$VM_BR_NS" >>"$VM_WORK/netns"
    ip -n "$VM_BR_NS" link add br0 type bridge
    ip -n "$VM_BR_NS" link set br0 up

    # Certificates as in the guide: one CA, a certificate per node, the S3
    # certificate naming the balancer from an S3 CA of its own, an admin
    # certificate for the operator.
    local pki="$VM_WORK/pki" s3pki="$VM_WORK/s3pki"
    "$VM_BIN" admin certs init --dir "$pki" >/dev/null
    "$VM_BIN" admin certs init --dir "$s3pki" >/dev/null
    "$VM_BIN" admin certs issue --dir "$s3pki" --role gateway --id s3 \
        --dns s3.sluice.test --ip "$VM_LB_IP" >/dev/null
    "$VM_BIN" admin certs issue --dir "$pki" --role admin --id ops >/dev/null

    while read -r host ip _roles; do
        case "$host" in '#'* | '') continue ;; esac
        idx=$((idx + 1))
        VM_HOST_IP[$host]=$ip
        VM_HOST_IDX[$host]=$idx
        [ "$host" = lb ] && { vm_add_ns "$(vm_ns lb)" "$ip" "$idx"; continue; }
        VM_HOSTS+=("$host")
        vm_add_ns "$(vm_ns "$host")" "$ip" "$idx"
        mkdir -p "$VM_WORK/$host/etc" "$VM_WORK/$host/tls" "$VM_WORK/$host/var"
        cp "$pki/ca.pem" "$VM_WORK/$host/tls/"
        for f in "$dir/$host"/*.toml; do
            stem=$(basename "$f" .toml)
            VM_PROCS+=("$host/$stem")
            # Only paths change: /etc/sluice/tls and /var/lib/sluice move
            # into this host's directory; addresses are the guide's.
            sed -e "s#/etc/sluice/tls/#$VM_WORK/$host/tls/#g" \
                -e "s#/var/lib/sluice/#$VM_WORK/$host/var/#g" "$f" >"$VM_WORK/$host/etc/$stem.toml"
            vm_issue_for "$pki" "$VM_WORK/$host" "$VM_WORK/$host/etc/$stem.toml"
        done
    done <"$dir/hosts"
    idx=$((idx + 1))
    vm_add_ns "$VM_CLIENT_NS" "$VM_CLIENT_IP" "$idx"

    # One XFS filesystem per datanode data dir (a sparse 4 GiB image: the
    # datanodes' reserved_free_bytes default is 1 GiB).
    local p
    for p in $(vm_procs_of datanode); do vm_mount_xfs "$p"; done

    cp "$VM_HERE/haproxy.cfg" "$VM_WORK/haproxy.cfg"
}

# vm_mount_xfs NAME: a fresh XFS image loop-mounted on the datanode's data_dir.
vm_mount_xfs() {
    local p=$1 data img
    data=$(sed -n 's/^data_dir *= *"\(.*\)"/\1/p' "$VM_WORK/${p%%/*}/etc/${p#*/}.toml")
    img="$VM_WORK/img/${p//\//__}.img"
    truncate -s 4G "$img"
    mkfs.xfs -q "$img"
    mkdir -p "$data"
    mount -o loop "$img" "$data"
    echo "$data" >>"$VM_WORK/mounts"
}

# vm_issue_for PKI HOSTDIR CONFIG: issues the certificate CONFIG names
# ([cluster_tls] cert_file) and copies it, its key and the S3 certificate
# (gateways) into the host's tls dir, as the guide's scp step does.
vm_issue_for() {
    local pki=$1 hostdir=$2 cfg=$3 cert base role id
    cert=$(sed -n '/^\[cluster_tls\]/,/^\[/s/^cert_file *= *"\(.*\)"/\1/p' "$cfg")
    base=$(basename "$cert" .pem)
    role=${base%%-*}
    id=${base#*-}
    if [ ! -f "$pki/$base.pem" ]; then
        "$VM_BIN" admin certs issue --dir "$pki" --role "$role" --id "$id" >/dev/null
    fi
    install -m 0644 "$pki/$base.pem" "$hostdir/tls/"
    install -m 0600 "$pki/$base.key" "$hostdir/tls/"
    if [ "$role" = gateway ]; then
        install -m 0644 "$VM_WORK/s3pki/gateway-s3.pem" "$hostdir/tls/"
        install -m 0600 "$VM_WORK/s3pki/gateway-s3.key" "$hostdir/tls/"
    fi
}

# vm_cleanup: every process, mount, loop device and namespace of this run.
vm_cleanup() {
    local rc=$? f pid m ns
    set +e
    trap - EXIT INT TERM
    [ -n "$VM_WORK" ] && [ -d "$VM_WORK" ] || return "$rc"
    for f in "$VM_WORK"/run/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill -TERM "$pid" 2>/dev/null
    done
    sleep 1
    for f in "$VM_WORK"/run/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m"
    done <"$VM_WORK/mounts"
    for f in "$VM_WORK"/img/*.img; do
        [ -f "$f" ] || continue
        losetup -j "$f" | cut -d: -f1 | while read -r dev; do losetup -d "$dev"; done
    done
    while read -r ns; do ip netns del "$ns" 2>/dev/null; done <"$VM_WORK/netns"
    if [ "$rc" -ne 0 ]; then
        local keep="/tmp/sluice-netns-logs-$VM_ID"
        rm -rf "$keep" && cp -r "$VM_WORK/logs" "$keep"
        vm_log "failed (exit $rc); logs kept in $keep:"
        for f in "$keep"/*.log; do
            printf '==== %s (last 15 lines)\n' "$(basename "$f")" >&2
            tail -n 15 "$f" >&2
        done
    fi
    rm -rf "$VM_WORK"
    vm_log "cleaned up"
    return "$rc"
}

# ---- the smoke's hooks (deploy/smoke/steps.sh) -----------------------------
vm_gateway_stopped=""
vm_host_stopped=""

smoke_stop_gateway() {
    vm_gateway_stopped=$(vm_first_of gateway)
    vm_log "stopping $vm_gateway_stopped"
    vm_stop "$vm_gateway_stopped"
}
smoke_start_gateway() {
    vm_start "$vm_gateway_stopped"
    vm_wait_ready "$vm_gateway_stopped"
}
smoke_stop_host() {
    # The last host with datanodes, both of them.
    local h
    for h in "${VM_HOSTS[@]}"; do [ -n "$(vm_procs_on "$h")" ] && vm_host_stopped=$h; done
    vm_log "stopping the datanodes of $vm_host_stopped"
    for p in $(vm_procs_on "$vm_host_stopped"); do vm_stop "$p"; done
}
smoke_start_host() {
    local p
    mapfile -t host_procs < <(vm_procs_on "$vm_host_stopped")
    for p in "${host_procs[@]}"; do vm_start "$p"; done
    vm_wait_ready "${host_procs[@]}"
}
smoke_wait_ready() {
    local p i
    for p in "${VM_PROCS[@]}"; do vm_running "$p" && vm_wait_ready "$p"; done
    # Through haproxy: its health checks see the gateways ready (rise 2 x 2 s).
    for i in $(seq 1 60); do
        smoke_aws s3 ls >/dev/null 2>&1 && return 0
        sleep 1
    done
    vm_die "S3 through haproxy not answering"
}
smoke_restart_all() {
    vm_stop_all
    vm_start_all
}

# vm_admin ARGS...: `sluice admin ARGS` from the client VM with the operator's
# certificate, against the layout's meta endpoints.
vm_admin() {
    ip netns exec "$VM_CLIENT_NS" env SLUICE_META="$VM_META_ENDPOINTS" \
        SLUICE_ADMIN_CA="$VM_WORK/pki/ca.pem" SLUICE_ADMIN_CERT="$VM_WORK/pki/admin-ops.pem" \
        SLUICE_ADMIN_KEY="$VM_WORK/pki/admin-ops.key" "$VM_BIN" admin "$@"
}

# vm_ops: the guide's operations on the running cluster. Step 10: a datanode
# added later (a third disk on the first storage host, id 7). Step 11: the
# VM of meta 3 fails (every process on it stopped) and a new VM, meta-new at
# 10.0.0.14, replaces it as meta 4 (`join = true`, `sluice admin meta replace`).
# Then everything written reads back and a new object writes.
vm_ops() {
    local host h p i
    for host in "${VM_HOSTS[@]}"; do [ -n "$(vm_procs_on "$host")" ] && break; done
    vm_log "guide step 10: datanode 7 added on $host"
    "$VM_BIN" admin certs issue --dir "$VM_WORK/pki" --role datanode --id 7 >/dev/null
    install -m 0644 "$VM_WORK/pki/datanode-7.pem" "$VM_WORK/$host/tls/"
    install -m 0600 "$VM_WORK/pki/datanode-7.key" "$VM_WORK/$host/tls/"
    sed -e 's/^node_id = .*/node_id = 7/' -e 's/7102/7103/g' -e 's/7192/7193/' \
        -e 's#/datanode-2"#/datanode-3"#' -e 's/datanode-[0-9]*\.\(pem\|key\)"/datanode-7.\1"/' \
        "$VM_WORK/$host/etc/datanode-2.toml" >"$VM_WORK/$host/etc/datanode-3.toml"
    VM_PROCS+=("$host/datanode-3")
    vm_mount_xfs "$host/datanode-3"
    vm_start "$host/datanode-3"
    vm_wait_ready "$host/datanode-3"
    vm_admin datanode list >&2
    vm_admin datanode list | grep -Eq '^ *7 .*\bup\b' || vm_die "datanode 7 is not listed up"

    # The VM of meta 3 fails: every process on it.
    local dead
    for h in "${VM_HOSTS[@]}"; do
        grep -q '^node_id = 3$' "$VM_WORK/$h/etc/meta.toml" 2>/dev/null && dead=$h
    done
    vm_log "guide step 11: $dead fails, meta-new (10.0.0.14) replaces meta 3 as meta 4"
    local keep=()
    for p in "${VM_PROCS[@]}"; do
        if [ "${p%%/*}" = "$dead" ]; then vm_stop "$p"; else keep+=("$p"); fi
    done
    VM_PROCS=("${keep[@]}")
    h=meta-new
    VM_HOST_IP[$h]=10.0.0.14
    VM_HOST_IDX[$h]=99
    VM_HOSTS+=("$h")
    vm_add_ns "$(vm_ns "$h")" 10.0.0.14 99
    mkdir -p "$VM_WORK/$h/etc" "$VM_WORK/$h/tls" "$VM_WORK/$h/var"
    "$VM_BIN" admin certs issue --dir "$VM_WORK/pki" --role meta --id 4 >/dev/null
    install -m 0644 "$VM_WORK/pki/ca.pem" "$VM_WORK/pki/meta-4.pem" "$VM_WORK/$h/tls/"
    install -m 0600 "$VM_WORK/pki/meta-4.key" "$VM_WORK/$h/tls/"
    # The guide's meta.toml for the replacement, paths moved.
    cat >"$VM_WORK/$h/etc/meta.toml" <<T
node_id = 4
listen = "0.0.0.0:7001"
advertise_addr = "https://10.0.0.14:7001"
data_dir = "$VM_WORK/$h/var/meta"
metrics_listen = "0.0.0.0:7091"
join = true
[cluster_tls]
ca_file = "$VM_WORK/$h/tls/ca.pem"
cert_file = "$VM_WORK/$h/tls/meta-4.pem"
key_file = "$VM_WORK/$h/tls/meta-4.key"
T
    VM_PROCS+=("$h/meta")
    vm_start "$h/meta"
    # Until a leader is elected without meta 3, replace may be refused: retry.
    for i in $(seq 1 30); do
        vm_admin meta replace 3 --id 4 --addr https://10.0.0.14:7001 >&2 && break
        [ "$i" = 30 ] && vm_die "sluice admin meta replace failed"
        sleep 2
    done
    VM_META_ENDPOINTS="$VM_META_ENDPOINTS,https://10.0.0.14:7001"
    vm_wait_ready "$h/meta"
    vm_admin meta list >&2
    vm_admin meta list --json | grep -q '10.0.0.14' || vm_die "meta 4 is not a member"
    vm_admin meta list --json | grep -q '10.0.0.13' && vm_die "meta 3 is still a member"
    smoke_wait_ready
    smoke_check_all
    head -c $((8 * 1024 * 1024)) /dev/urandom >"$SMOKE_WORK/after-ops.bin"
    smoke_put_check "$SMOKE_WORK/after-ops.bin" after-ops.bin
    echo "OPS OK datanode_added=7 meta_replaced=3->4"
}

# The aws CLI runs in the client namespace.
aws() { ip netns exec "$VM_CLIENT_NS" env PATH="$PATH" aws "$@"; }

# ---- main ----------------------------------------------------------------
vm_main() {
    VM_BIN=$(readlink -f "${1:?usage: netns-smoke.sh SLUICE_BINARY [3-vm|6-vm]}")
    local layout=${2:-6-vm} t0 p n=0
    [ "$(id -u)" = 0 ] || vm_die "needs root (network namespaces, loop mounts)"
    local tool
    for tool in ip mkfs.xfs haproxy aws losetup; do
        command -v "$tool" >/dev/null || vm_die "needs $tool"
    done
    t0=$(date +%s)
    trap vm_cleanup EXIT
    trap 'exit 130' INT TERM
    vm_setup "$layout"
    vm_start_all
    vm_start_haproxy

    # Every datanode's data dir is XFS, and the datanode says so.
    for p in $(vm_procs_of datanode); do
        sed 's/\x1b\[[0-9;]*m//g' "$(vm_logfile "$p")" | grep -q 'data dir filesystem.*filesystem=xfs' ||
            vm_die "$p did not log filesystem=xfs: $(grep -m1 'filesystem' "$(vm_logfile "$p")")"
        n=$((n + 1))
    done
    echo "XFS OK datanodes=$n"

    # The operator's view, with the admin certificate, from the client VM.
    VM_META_ENDPOINTS=""
    for p in $(vm_procs_of meta); do
        VM_META_ENDPOINTS="$VM_META_ENDPOINTS${VM_META_ENDPOINTS:+,}https://${VM_HOST_IP[${p%%/*}]}:7001"
    done
    vm_admin status >&2 || vm_die "sluice admin status failed"

    # shellcheck source=deploy/smoke/steps.sh
    source "$VM_REPO/deploy/smoke/steps.sh"
    local gw_cfg
    gw_cfg=$(vm_first_of gateway)
    gw_cfg="$VM_WORK/${gw_cfg%%/*}/etc/${gw_cfg#*/}.toml"
    AWS_ACCESS_KEY_ID=$(sed -n 's/^access_key *= *"\(.*\)"/\1/p' "$gw_cfg")
    AWS_SECRET_ACCESS_KEY=$(sed -n 's/^secret_key *= *"\(.*\)"/\1/p' "$gw_cfg")
    export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
    export S3_ENDPOINT="https://$VM_LB_IP:443"
    export S3_CA_BUNDLE="$VM_WORK/s3pki/ca.pem"
    SMOKE_WORK="$VM_WORK/smoke"
    smoke_wait_ready
    smoke_run
    # NETNS_OPS=0 skips the guide's operations (steps 10 and 11).
    if [ "${NETNS_OPS:-1}" = 1 ]; then vm_ops; fi
    echo "NETNS LAYOUT $layout namespaces=$(wc -l <"$VM_WORK/netns") processes=${#VM_PROCS[@]} seconds=$(($(date +%s) - t0))"
}

if [ "${NETNS_LIB:-}" != 1 ]; then
    vm_main "$@"
fi
