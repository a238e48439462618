#!/usr/bin/env bash
# The deployment smoke test on the compose cluster: builds the images, brings
# the cluster up on a fresh project name (sluice-smoke-<random>), runs the
# shared steps of deploy/smoke/steps.sh through haproxy (multipart upload of a
# 200 MiB object, 200 small objects, a gateway stopped, a whole host stopped,
# everything restarted; every byte compared), prints
#   SMOKE PASS up=<MiB/s> down=<MiB/s> ...
# and ALWAYS tears the cluster down (containers, volumes, network, its images
# and generated files), also on failure or Ctrl-C.
#
#   deploy/compose/smoke.sh
#
# Environment:
#   SLUICE_BIN           sluice binary for the image (default: cargo build --release)
#   SLUICE_S3_PORT       haproxy's S3 port on 127.0.0.1 (default: a free port)
#   SLUICE_STATUS_PORT   haproxy's status port on 127.0.0.1 (default: a free port)
#   SMOKE_BIG_MIB, SMOKE_SMALL_COUNT   see deploy/smoke/steps.sh
#   SMOKE_KEEP=1         keep the cluster and files after a failure (to debug)
# Needs docker, docker-compose (v1), the aws CLI, curl, and haproxy on the
# host (for its image; deploy/image/build-haproxy.sh installs it with apt).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

log() { printf '[compose-smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for tool in docker docker-compose aws curl python3; do
    command -v "$tool" >/dev/null || { log "missing: $tool"; exit 1; }
done

suffix="$(date +%s)-$RANDOM"
export COMPOSE_PROJECT_NAME="sluice-smoke-$suffix"
export SLUICE_S3_PORT="${SLUICE_S3_PORT:-$(free_port)}"
export SLUICE_STATUS_PORT="${SLUICE_STATUS_PORT:-$(free_port)}"
while [ "$SLUICE_STATUS_PORT" = "$SLUICE_S3_PORT" ]; do SLUICE_STATUS_PORT=$(free_port); done
export SLUICE_PAGE_PORT="${SLUICE_PAGE_PORT:-$(free_port)}"
while [ "$SLUICE_PAGE_PORT" = "$SLUICE_S3_PORT" ] || [ "$SLUICE_PAGE_PORT" = "$SLUICE_STATUS_PORT" ]; do
    SLUICE_PAGE_PORT=$(free_port)
done
export SLUICE_IMAGE="sluice:smoke-$suffix"
export HAPROXY_IMAGE="haproxy:smoke-$suffix"
work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-compose-smoke.XXXXXX")"
export SLUICE_CLUSTER_DIR="$work/cluster"
export SMOKE_WORK="$work/data"
compose=(docker-compose -f "$here/docker-compose.yml")
started=$(date +%s)

teardown() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$rc" -ne 0 ]; then
        log "failed (exit $rc); last log lines of every service:"
        "${compose[@]}" ps >&2 || true
        "${compose[@]}" logs --no-color --tail 15 >&2 || true
        if [ "${SMOKE_KEEP:-0}" = 1 ]; then
            log "SMOKE_KEEP=1: left project $COMPOSE_PROJECT_NAME and $work"
            exit "$rc"
        fi
    fi
    log "tearing down project $COMPOSE_PROJECT_NAME"
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    docker rmi "$SLUICE_IMAGE" "$HAPROXY_IMAGE" >/dev/null 2>&1 || true
    rm -rf "$work"
    log "took $(( $(date +%s) - started )) s"
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- images
if [ -n "${SLUICE_BIN:-}" ]; then
    "$repo/deploy/image/build.sh" --binary "$SLUICE_BIN" --tag "$SLUICE_IMAGE"
else
    "$repo/deploy/image/build.sh" --tag "$SLUICE_IMAGE"
fi
"$repo/deploy/image/build-haproxy.sh" --tag "$HAPROXY_IMAGE"

# ---- the cluster
"$here/up.sh" 2>&1 | sed 's/^/  /' >&2
set -a
# shellcheck disable=SC1091
. "$SLUICE_CLUSTER_DIR/s3/credentials"
set +a
export S3_ENDPOINT="https://127.0.0.1:$SLUICE_S3_PORT"
export S3_CA_BUNDLE="$SLUICE_CLUSTER_DIR/s3/ca.pem"

# shellcheck source=deploy/compose/lib.sh
source "$here/lib.sh"

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every second until it succeeds.
wait_for() {
    local limit="$1" what="$2" deadline
    shift 2
    deadline=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "timed out after ${limit} s waiting for: $what"
            return 1
        fi
        sleep 1
    done
}

# Datanodes of host-a whose state in meta is `$1` (up or not up).
host_a_is() {
    local table
    table=$(admin datanode list) || return 1
    if [ "$1" = up ]; then
        printf '%s\n' "$table" | awk '$3 == "host-a" { n++; if ($4 != "up") bad = 1 } END { exit !(n == 2 && !bad) }'
    else
        printf '%s\n' "$table" | awk '$3 == "host-a" { n++; if ($4 == "up") bad = 1 } END { exit !(n == 2 && !bad) }'
    fi
}

# Every container of the project running and healthy (haproxy: running).
all_healthy() {
    local ids id state
    ids=$("${compose[@]}" ps -q)
    # Every service the compose file defines has its container.
    [ "$(printf '%s\n' "$ids" | grep -c .)" -eq "$("${compose[@]}" config --services | grep -c .)" ] || return 1
    for id in $ids; do
        state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")
        case "$state" in
            "running healthy" | "running none") ;;
            *) return 1 ;;
        esac
    done
}

# haproxy sees both gateways UP and serves /health/ready.
haproxy_ready() {
    local csv
    csv=$(curl -fsS "http://127.0.0.1:$SLUICE_STATUS_PORT/;csv") || return 1
    [ "$(printf '%s\n' "$csv" | awk -F, '$1 == "gateways" && ($2 == "gw1" || $2 == "gw2") && $18 == "UP"' | wc -l)" -eq 2 ] || return 1
    curl -fsS --cacert "$S3_CA_BUNDLE" -o /dev/null "$S3_ENDPOINT/health/ready"
}

# The status page (`sluice admin serve`) contains $1.
page_shows() {
    local page
    page=$(curl -fsS "http://127.0.0.1:$SLUICE_PAGE_PORT/") || return 1
    [[ "$page" == *"$1"* ]]
}

# docker-compose COMMAND... with its progress lines on stderr, minus the
# "Stopping x ... " halves that the "... done" lines repeat.
dc() { "${compose[@]}" --ansi never "$@" 2>&1 | { grep -v '\.\.\. *$' || true; } >&2; }

smoke_stop_gateway() { dc stop gw2; }
smoke_start_gateway() { dc start gw2; }
smoke_stop_host() {
    dc stop dn1 dn2
    # Placement must know: writes go to the 4 datanodes left.
    wait_for 60 "meta to see host-a's datanodes down" host_a_is down
    log "meta sees host-a (dn1, dn2) down"
    # The status page shows it within a poll (5 s).
    wait_for 30 "the status page to show 4 of 6 datanodes up" page_shows '4 / 6</b>'
    log "the status page shows 4 / 6 datanodes up"
    # ... and the gateways' datanode set (refreshed every 2 s).
    sleep 3
}
smoke_start_host() {
    dc start dn1 dn2
    wait_for 60 "meta to see host-a's datanodes up" host_a_is up
    log "meta sees host-a up"
}
smoke_wait_ready() {
    wait_for 180 "every container healthy" all_healthy
    wait_for 60 "haproxy to see both gateways up" haproxy_ready
    wait_for 30 "the status page to show 6 of 6 datanodes up" page_shows '6 / 6</b>'
    log "every container healthy, haproxy sees both gateways up"
}
smoke_restart_all() {
    dc stop
    log "every container stopped"
    dc up -d
}

# shellcheck source=deploy/smoke/steps.sh
source "$repo/deploy/smoke/steps.sh"
smoke_wait_ready
smoke_run
