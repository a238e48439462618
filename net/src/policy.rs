//! The per-RPC role policy: ONE table per gRPC service, mapping each
//! method to the roles that may call it. Deny by default: a method not in
//! its service's table, or a service with no table, is refused.

use crate::Role;

use Role::{Admin, Datanode, Gateway, Meta};

/// The allowed roles of each method of one gRPC service.
#[derive(Debug)]
pub struct ServiceTable {
    /// The full service name, e.g. `sluice.meta.Meta`.
    pub service: &'static str,
    /// `(method, roles)`; a method listed with no roles is callable by
    /// nobody.
    pub methods: &'static [(&'static str, &'static [Role])],
    /// Roles allowed on methods not listed (empty: deny).
    pub other_methods: &'static [Role],
}

impl ServiceTable {
    /// The roles that may call `method` of this service.
    pub fn roles(&self, method: &str) -> &'static [Role] {
        self.methods
            .iter()
            .find(|(m, _)| *m == method)
            .map(|(_, r)| *r)
            .unwrap_or(self.other_methods)
    }
}

const GW: &[Role] = &[Gateway];
const DN: &[Role] = &[Datanode];

/// `sluice.meta.Meta` (meta/src/api.rs). Callers: the gateway (buckets,
/// objects, uploads, epochs, placement and heal), the datanode
/// (membership, shard GC, scrub reports; see datanode/src/membership.rs,
/// gc.rs, scrub.rs) and `sluice admin` (cluster reads).
pub static META: ServiceTable = ServiceTable {
    service: "sluice.meta.Meta",
    methods: &[
        ("CreateBucket", GW),
        ("GetBucket", GW),
        ("DeleteBucket", GW),
        ("ListBuckets", GW),
        ("PutObject", GW),
        ("GetObject", GW),
        ("DeleteObject", GW),
        ("PutObjectTagging", GW),
        ("PutObjectAcl", GW),
        ("PutBucketConfig", GW),
        ("ListObjects", GW),
        ("ListVersions", GW),
        ("CreateUpload", GW),
        ("GetUpload", GW),
        ("PutPart", GW),
        ("ListParts", GW),
        ("CompleteUpload", GW),
        ("AbortUpload", GW),
        ("ListUploads", GW),
        // The datanode may register and heartbeat only as itself: the
        // handler also checks the certificate's id.
        ("RegisterDatanode", DN),
        ("Heartbeat", DN),
        // The datanode's readiness probe reads the registry for itself.
        ("ListDatanodes", &[Gateway, Datanode, Admin]),
        ("FilterUnreferenced", DN),
        ("Collectable", DN),
        ("OpenEpoch", GW),
        ("RenewEpoch", GW),
        ("ListPlacements", GW),
        ("ReportMissing", &[Gateway, Datanode]),
        // Un-marking is the audit's, after it read the shards through on
        // their node: a datanode's word alone never un-marks a shard.
        ("ReportPresent", GW),
        ("BeginHeal", GW),
        ("UpdatePlacement", GW),
        ("LeaseBlobs", GW),
        ("ReleaseBlobs", GW),
        // Meta: a node's own readiness probe, and the leader asking each
        // voter for `sluice admin status`.
        ("ClusterStatus", &[Gateway, Meta, Admin]),
        // The gateway resolves S3 access keys (secret and grants).
        ("GetAccessKey", GW),
    ],
    other_methods: &[],
};

/// `sluice.raft.Raft`: meta peers only.
pub static RAFT: ServiceTable = ServiceTable {
    service: "sluice.raft.Raft",
    methods: &[
        ("Vote", &[Meta]),
        ("AppendEntries", &[Meta]),
        ("InstallSnapshot", &[Meta]),
        // The leader asks each member what it understands before it
        // finalizes the cluster version.
        ("NodeVersion", &[Meta]),
    ],
    other_methods: &[],
};

/// `sluice.datanode.Datanode` (datanode/src/service.rs). Callers: the
/// gateway (shard I/O, credit, heal audit, deleting a failed write's
/// shards), meta's reclaimer (DeleteBlobs) and `sluice admin`.
pub static DATANODE: ServiceTable = ServiceTable {
    service: "sluice.datanode.Datanode",
    methods: &[
        ("PutShard", GW),
        ("GetShard", GW),
        ("DeleteBlobs", &[Gateway, Meta]),
        ("ListShards", &[Admin]),
        ("NodeStatus", &[Gateway, Admin]),
        ("HasShards", GW),
        ("VerifyShards", GW),
        ("Credits", GW),
        ("ReportCredits", GW),
    ],
    other_methods: &[],
};

/// `sluice.admin.Admin` (meta/src/admin.rs): admin certificates only, every
/// method (present and future).
pub static ADMIN: ServiceTable = ServiceTable {
    service: "sluice.admin.Admin",
    methods: &[],
    other_methods: &[Admin],
};

/// The tables of the services one server serves.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    tables: &'static [&'static ServiceTable],
}

/// Meta's listener: Raft, Meta, Admin.
pub const META_SERVER: Policy = Policy {
    tables: &[&RAFT, &META, &ADMIN],
};

/// A datanode's listener.
pub const DATANODE_SERVER: Policy = Policy {
    tables: &[&DATANODE],
};

impl Policy {
    /// A policy over `tables`.
    pub const fn new(tables: &'static [&'static ServiceTable]) -> Self {
        Policy { tables }
    }

    /// The roles allowed on the gRPC path `/<service>/<method>` (empty:
    /// nobody; unknown services and malformed paths included).
    pub fn roles(&self, path: &str) -> &'static [Role] {
        let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
            return &[];
        };
        if method.is_empty() || method.contains('/') {
            return &[];
        }
        self.tables
            .iter()
            .find(|t| t.service == service)
            .map(|t| t.roles(method))
            .unwrap_or(&[])
    }

    /// Whether `role` may call `path`.
    pub fn allows(&self, path: &str, role: Role) -> bool {
        self.roles(path).contains(&role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(service, [rpc])` declared in a .proto file.
    fn services(proto: &str) -> Vec<(String, Vec<String>)> {
        let package = proto
            .lines()
            .find_map(|l| l.trim().strip_prefix("package "))
            .map(|p| p.trim_end_matches(';').trim().to_string())
            .expect("package");
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for line in proto.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                let name = rest.split_whitespace().next().unwrap();
                out.push((format!("{package}.{name}"), Vec::new()));
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.last_mut().expect("rpc inside a service").1.push(name);
            }
        }
        out
    }

    /// Every RPC of every service in proto/proto has an explicit entry (or
    /// a service-wide rule), and no table names an RPC that does not exist.
    #[test]
    fn tables_cover_every_rpc_of_the_protos() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
        let tables = [&META, &RAFT, &DATANODE, &ADMIN];
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for (service, rpcs) in services(&text) {
                let table = tables
                    .iter()
                    .find(|t| t.service == service)
                    .unwrap_or_else(|| panic!("no policy table for {service}"));
                for rpc in &rpcs {
                    assert!(
                        !table.roles(rpc).is_empty(),
                        "{service}/{rpc}: no role may call it; add it to the table"
                    );
                }
                for (m, _) in table.methods {
                    assert!(rpcs.iter().any(|r| r == m), "{service}/{m} is not an RPC");
                }
                seen.push(service);
            }
        }
        for t in tables {
            assert!(
                seen.iter().any(|s| s == t.service),
                "{} not in protos",
                t.service
            );
        }
    }

    #[test]
    fn roles_per_service() {
        let p = META_SERVER;
        assert!(p.allows("/sluice.raft.Raft/Vote", Meta));
        for r in [Gateway, Datanode, Admin] {
            assert!(!p.allows("/sluice.raft.Raft/Vote", r));
            assert!(!p.allows("/sluice.raft.Raft/AppendEntries", r));
        }
        assert!(p.allows("/sluice.meta.Meta/PutObject", Gateway));
        assert!(!p.allows("/sluice.meta.Meta/PutObject", Datanode));
        assert!(!p.allows("/sluice.meta.Meta/CreateBucket", Datanode));
        assert!(!p.allows("/sluice.meta.Meta/CreateBucket", Admin));
        assert!(p.allows("/sluice.meta.Meta/Heartbeat", Datanode));
        assert!(!p.allows("/sluice.meta.Meta/Heartbeat", Gateway));
        assert!(p.allows("/sluice.meta.Meta/ClusterStatus", Admin));
        assert!(p.allows("/sluice.admin.Admin/CreateKey", Admin));
        for r in [Gateway, Datanode, Meta] {
            assert!(!p.allows("/sluice.admin.Admin/CreateKey", r));
        }
        // Deny by default.
        for r in Role::ALL {
            assert!(!p.allows("/sluice.meta.Meta/NoSuchRpc", r));
            assert!(!p.allows("/sluice.other.Svc/Call", r));
            assert!(!p.allows("/sluice.datanode.Datanode/PutShard", r));
            assert!(!p.allows("garbage", r));
            assert!(!p.allows("/sluice.admin.Admin/", r));
        }
        let d = DATANODE_SERVER;
        assert!(d.allows("/sluice.datanode.Datanode/PutShard", Gateway));
        assert!(!d.allows("/sluice.datanode.Datanode/PutShard", Datanode));
        assert!(d.allows("/sluice.datanode.Datanode/DeleteBlobs", Meta));
        assert!(!d.allows("/sluice.datanode.Datanode/DeleteBlobs", Admin));
        assert!(!d.allows("/sluice.meta.Meta/PutObject", Gateway));
    }
}
