# shellcheck shell=bash
# Helpers of build.sh and build-haproxy.sh: a FROM scratch root filesystem
# made of one binary and exactly the shared libraries `ldd` lists for it.

# image_rootfs ROOT BINARY DEST: copies BINARY to ROOT/DEST and every library
# `ldd BINARY` names (the dynamic loader included) to the same path under ROOT.
image_rootfs() {
    local root="$1" binary="$2" dest="$3" lib
    mkdir -p "$root$(dirname "$dest")" "$root/tmp"
    chmod 1777 "$root/tmp"
    cp "$binary" "$root$dest"
    chmod 0755 "$root$dest"
    # `libx.so => /path (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`;
    # linux-vdso has no file.
    for lib in $(ldd "$binary" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
    # Name resolution: /etc/hosts first, then DNS (Docker's embedded DNS
    # answers container names); both modules are built into glibc's libc.so.6.
    mkdir -p "$root/etc"
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# image_users ROOT NAME ID: /etc/passwd and /etc/group with root and the
# non-root user NAME (uid = gid = ID, no shell, no home but its data dir).
image_users() {
    local root="$1" name="$2" id="$3"
    mkdir -p "$root/etc"
    printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:%s:%s:%s:/var/lib/%s:/sbin/nologin\n' \
        "$name" "$id" "$id" "$name" "$name" >"$root/etc/passwd"
    printf 'root:x:0:\n%s:x:%s:\n' "$name" "$id" >"$root/etc/group"
}

# image_build CONTEXT TAG: `docker build` of CONTEXT/Dockerfile. The classic
# builder (DOCKER_BUILDKIT=0) needs no buildx plugin and pulls nothing for a
# FROM scratch image.
image_build() {
    local out
    if ! out="$(DOCKER_BUILDKIT=0 docker build --quiet --tag "$2" "$1" 2>&1)"; then
        printf '%s\n' "$out" >&2
        return 1
    fi
}
