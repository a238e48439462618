# shellcheck shell=bash
# The deployment smoke steps, shared by deploy/compose/smoke.sh (containers)
# and the network-namespace VM layout test (deploy/vm/netns-smoke.sh).
#
# A driver sources this file, then calls `smoke_run`. It must set
#   S3_ENDPOINT            the load balancer's S3 URL (haproxy), e.g. https://127.0.0.1:8443
#   S3_CA_BUNDLE           PEM file the client trusts for it ("" = system roots / plain http)
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   an access key of the cluster
#   SMOKE_WORK             a scratch directory (about 3 x 200 MiB is written there)
# and define these functions (each returns once the change has happened):
#   smoke_stop_gateway / smoke_start_gateway   stop / start one of the two gateways
#   smoke_stop_host / smoke_start_host         stop / start one "host" (both its datanodes)
#   smoke_wait_ready                           wait until the cluster serves S3 again
#                                              (after a start or a restart)
#   smoke_restart_all                          stop every process and start it again, data kept
# It may set SMOKE_BIG_MIB (default 200) and SMOKE_SMALL_COUNT (default 200).
#
# Every step checks bytes with sha256; a failure prints what failed and
# returns non-zero (the drivers run with `set -e`). The last line printed is
#   SMOKE PASS up=<MiB/s> down=<MiB/s> ...
# with the multipart upload and download rates through the load balancer.

export AWS_EC2_METADATA_DISABLED=true
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"

smoke_log() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

smoke_fail() {
    smoke_log "FAIL: $*"
    return 1
}

smoke_aws() {
    if [ -n "${S3_CA_BUNDLE:-}" ]; then
        aws --endpoint-url "$S3_ENDPOINT" --ca-bundle "$S3_CA_BUNDLE" "$@"
    else
        aws --endpoint-url "$S3_ENDPOINT" "$@"
    fi
}

smoke_now() { date +%s.%N; }

# MiB/s for `$1` MiB moved between times `$2` and `$3`.
smoke_rate() { awk -v m="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%.1f", m / (b - a) }'; }

# Uploads `$1` as s3://$SMOKE_BUCKET/$2 and checks that a read gives the same bytes.
smoke_put_check() {
    smoke_aws s3 cp --only-show-errors "$1" "s3://$SMOKE_BUCKET/$2"
    smoke_get_check "$1" "$2"
}

# Writes 24 MiB of random bytes as s3://$SMOKE_BUCKET/$1, checks a read of
# it, and adds it to what smoke_check_all reads back.
smoke_put_new() {
    head -c $((24 * 1024 * 1024)) /dev/urandom >"$SMOKE_WORK/$1"
    smoke_put_check "$SMOKE_WORK/$1" "$1"
    SMOKE_EXTRA+=("$1")
}

# Reads s3://$SMOKE_BUCKET/$2 and compares it with local file `$1`.
smoke_get_check() {
    local out="$SMOKE_WORK/get.tmp"
    rm -f "$out"
    smoke_aws s3 cp --only-show-errors "s3://$SMOKE_BUCKET/$2" "$out"
    cmp -s "$1" "$out" || smoke_fail "s3://$SMOKE_BUCKET/$2 differs from $1"
    rm -f "$out"
}

# Reads back the big object and every small object, byte-identical.
smoke_check_all() {
    smoke_get_check "$SMOKE_WORK/big.bin" big.bin
    local back="$SMOKE_WORK/small-back"
    rm -rf "$back"
    smoke_aws s3 cp --only-show-errors --recursive "s3://$SMOKE_BUCKET/small/" "$back/"
    diff -r "$SMOKE_WORK/small" "$back" >/dev/null || smoke_fail "small objects differ"
    rm -rf "$back"
    local name
    for name in "${SMOKE_EXTRA[@]}"; do
        smoke_get_check "$SMOKE_WORK/$name" "$name"
    done
}

smoke_run() {
    local big_mib="${SMOKE_BIG_MIB:-200}" small_count="${SMOKE_SMALL_COUNT:-200}"
    SMOKE_BUCKET="smoke-$(date +%s)-$RANDOM"
    SMOKE_EXTRA=()
    mkdir -p "$SMOKE_WORK"
    # Multipart in 16 MiB parts, 8 at once (the aws CLI's s3 settings).
    export AWS_CONFIG_FILE="$SMOKE_WORK/aws-config"
    printf '[default]\ns3 =\n    multipart_threshold = 16MB\n    multipart_chunksize = 16MB\n    max_concurrent_requests = 8\n' >"$AWS_CONFIG_FILE"

    smoke_log "bucket $SMOKE_BUCKET at $S3_ENDPOINT"
    smoke_aws s3 mb "s3://$SMOKE_BUCKET" >/dev/null

    head -c "$((big_mib * 1024 * 1024))" /dev/urandom >"$SMOKE_WORK/big.bin"
    rm -rf "$SMOKE_WORK/small" && mkdir -p "$SMOKE_WORK/small"
    local i
    for i in $(seq 1 "$small_count"); do
        head -c "$(( (RANDOM % 64 + 1) * 1024 ))" /dev/urandom >"$SMOKE_WORK/small/obj-$i"
    done

    smoke_log "multipart upload of $big_mib MiB"
    local t0 t1 t2
    t0=$(smoke_now)
    smoke_aws s3 cp --only-show-errors "$SMOKE_WORK/big.bin" "s3://$SMOKE_BUCKET/big.bin"
    t1=$(smoke_now)
    smoke_get_check "$SMOKE_WORK/big.bin" big.bin
    t2=$(smoke_now)
    local up down
    up=$(smoke_rate "$big_mib" "$t0" "$t1")
    down=$(smoke_rate "$big_mib" "$t1" "$t2")
    smoke_log "up $up MiB/s, down $down MiB/s"

    smoke_log "$small_count small objects"
    local s0 s1
    s0=$(smoke_now)
    smoke_aws s3 cp --only-show-errors --recursive "$SMOKE_WORK/small/" "s3://$SMOKE_BUCKET/small/"
    s1=$(smoke_now)
    local listed
    # length(Contents), not KeyCount: the aws CLI merges its pages and drops
    # KeyCount (prints None).
    listed=$(smoke_aws s3api list-objects-v2 --bucket "$SMOKE_BUCKET" --prefix small/ \
        --query 'length(Contents)' --output text)
    [ "$listed" = "$small_count" ] || smoke_fail "listed $listed small objects, wrote $small_count"
    smoke_check_all

    smoke_log "one gateway stopped: uploads and reads go through the other"
    smoke_stop_gateway
    smoke_put_new after-gateway.bin
    smoke_check_all
    smoke_start_gateway
    smoke_wait_ready

    smoke_log "one host (two datanodes) stopped: reads work, writes succeed"
    smoke_stop_host
    smoke_check_all
    smoke_put_new after-host.bin
    smoke_start_host
    smoke_wait_ready

    smoke_log "every process restarted: everything reads back"
    smoke_restart_all
    smoke_wait_ready
    smoke_check_all

    local small_ops
    small_ops=$(awk -v n="$small_count" -v a="$s0" -v b="$s1" 'BEGIN { printf "%.0f", n / (b - a) }')
    echo "SMOKE PASS up=${up}MiB/s down=${down}MiB/s big=${big_mib}MiB small_put=${small_ops}ops/s small=${small_count} endpoint=$S3_ENDPOINT"
}
