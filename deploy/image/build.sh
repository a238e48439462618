#!/usr/bin/env bash
# Builds the `sluice` container image locally, pulling nothing (there is no
# registry): a FROM scratch image holding the binary at /usr/local/bin/sluice
# and exactly the shared libraries `ldd` lists for it (at their paths, the
# dynamic loader included), a minimal /etc/passwd and /etc/group with the
# non-root user `sluice` (uid/gid 10001), and /var/lib/sluice and /etc/sluice
# owned by it.
#
#   deploy/image/build.sh [--binary PATH] [--tag NAME]
#
#   --binary PATH   the sluice binary to put in the image (default: build it
#                   with `cargo build --release --locked -p sluice`)
#   --tag NAME      image name (default sluice:local)
#
# The image's entrypoint is `sluice`; give the role as the command, e.g.
#   docker run --rm sluice:local --version
#   docker run -v "$PWD/meta1:/etc/sluice:ro" sluice:local meta --config /etc/sluice/sluice.toml
# SLUICE_CONFIG=/etc/sluice/sluice.toml is set, and the HEALTHCHECK runs
# `sluice health`, which asks GET /health/ready on that config's
# metrics_listen (so every role's config must set metrics_listen).
#
# glibc (Debian 12) has its nss `files` and `dns` modules inside libc.so.6, so
# name resolution (/etc/hosts, Docker's embedded DNS for container names)
# works without any other file from the host.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=deploy/image/lib.sh
source "$here/lib.sh"

binary=""
tag="sluice:local"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$binary" ]; then
    repo="$(cd "$here/../.." && pwd)"
    (cd "$repo" && cargo build --release --locked -p sluice)
    binary="${CARGO_TARGET_DIR:-$repo/target}/release/sluice"
fi
[ -x "$binary" ] || { echo "not an executable: $binary" >&2; exit 1; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
image_rootfs "$ctx/root" "$binary" /usr/local/bin/sluice
image_users "$ctx/root" sluice 10001
mkdir -p "$ctx/owned/var/lib/sluice" "$ctx/owned/etc/sluice"

cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
COPY --chown=10001:10001 owned/ /
USER 10001:10001
WORKDIR /var/lib/sluice
ENV SLUICE_CONFIG=/etc/sluice/sluice.toml
HEALTHCHECK --interval=5s --timeout=4s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/sluice","health"]
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["--help"]
DOCKERFILE

image_build "$ctx" "$tag"
echo "built $tag from $binary"
