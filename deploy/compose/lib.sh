# shellcheck shell=bash
# Shared by up.sh and smoke.sh (sourced).

# `sluice admin ARGS...` on the compose network with the admin certificate
# in $SLUICE_CLUSTER_DIR/admin; needs COMPOSE_PROJECT_NAME, SLUICE_IMAGE and
# an absolute SLUICE_CLUSTER_DIR.
admin() {
    docker run --rm --network "${COMPOSE_PROJECT_NAME}_default" \
        -v "$SLUICE_CLUSTER_DIR/admin:/etc/sluice:ro" \
        -e SLUICE_META=https://meta1:7001,https://meta2:7001,https://meta3:7001 \
        -e SLUICE_ADMIN_CA=/etc/sluice/tls/ca.pem \
        -e SLUICE_ADMIN_CERT=/etc/sluice/tls/admin.pem \
        -e SLUICE_ADMIN_KEY=/etc/sluice/tls/admin.key \
        "$SLUICE_IMAGE" admin "$@"
}
