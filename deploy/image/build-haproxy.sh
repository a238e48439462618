#!/usr/bin/env bash
# Builds a haproxy container image locally, pulling nothing: FROM scratch
# with the host's /usr/sbin/haproxy (Debian's package; installed here with
# `apt-get install -y haproxy` when missing, which needs root) and exactly
# the shared libraries `ldd` lists for it, running as the non-root user
# `haproxy` (uid/gid 10002). It reads /usr/local/etc/haproxy/haproxy.cfg
# (mount yours there) and binds no port below 1024 unless given one.
#
#   deploy/image/build-haproxy.sh [--tag NAME]     (default haproxy:local)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=deploy/image/lib.sh
source "$here/lib.sh"

tag="haproxy:local"
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ ! -x /usr/sbin/haproxy ]; then
    echo "haproxy is not installed: apt-get install -y haproxy" >&2
    apt-get update -qq && apt-get install -y -qq haproxy
fi

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
image_rootfs "$ctx/root" /usr/sbin/haproxy /usr/sbin/haproxy
image_users "$ctx/root" haproxy 10002
mkdir -p "$ctx/owned/var/lib/haproxy" "$ctx/owned/usr/local/etc/haproxy"

cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
COPY --chown=10002:10002 owned/ /
USER 10002:10002
WORKDIR /var/lib/haproxy
STOPSIGNAL SIGUSR1
ENTRYPOINT ["/usr/sbin/haproxy"]
CMD ["-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
DOCKERFILE

image_build "$ctx" "$tag"
echo "built $tag from /usr/sbin/haproxy ($(/usr/sbin/haproxy -v | head -1))"
