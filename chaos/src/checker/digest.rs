//! The replica check: after the load, the meta voters' digests of their
//! applied state (`sluice admin meta digest --json`) must be equal at an
//! equal applied index. Apply is a function of the state and the entry, so
//! two voters that applied the same log prefix hold the same state; a
//! difference is a divergence the S3 history may never show (a voter that
//! skipped an entry serves it wrong only once it leads).
//!
//! Voters keep applying after the load stops (the leader's sweeps and the
//! gateways' epoch renewals append entries), so one poll may catch them
//! at different indexes; the run polls until they line up
//! (`crate::run`), and [`compare`] judges each poll.

use serde::Serialize;

/// One voter's answer, as `sluice admin meta digest --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VoterDigest {
    pub id: u64,
    /// `Err`: the voter did not answer (its error).
    pub result: Result<(u64, String), String>,
}

/// What one poll of the digests shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum DigestVerdict {
    /// Every voter is at `applied_index` with the same `digest`.
    Agree { applied_index: u64, digest: String },
    /// Voters at the same applied index report different digests: the
    /// replicas diverged. (id, digest) of each voter at that index.
    Differ {
        applied_index: u64,
        digests: Vec<(u64, String)>,
    },
    /// No two voters at one index disagree, but not all are at the same
    /// index (poll again): (id, applied index) of each.
    NotAligned { indexes: Vec<(u64, u64)> },
    /// A voter did not answer, or the output did not parse (poll again).
    Unreadable(String),
    /// Not compared, and why: the voters run the previous release, which
    /// has no state digest (an upgrade rolled back).
    Skipped(String),
}

/// Parses `sluice admin meta digest --json`.
pub fn parse(json: &serde_json::Value) -> Result<Vec<VoterDigest>, String> {
    let voters = json
        .get("voters")
        .and_then(|v| v.as_array())
        .ok_or("no `voters` array")?;
    voters
        .iter()
        .map(|v| {
            let id = v
                .get("id")
                .and_then(|x| x.as_u64())
                .ok_or("a voter without `id`")?;
            if let Some(e) = v.get("error") {
                return Ok(VoterDigest {
                    id,
                    result: Err(e.as_str().unwrap_or("?").to_string()),
                });
            }
            let index = v
                .get("applied_index")
                .and_then(|x| x.as_u64())
                .ok_or("a voter without `applied_index`")?;
            let digest = v
                .get("digest")
                .and_then(|x| x.as_str())
                .ok_or("a voter without `digest`")?;
            Ok(VoterDigest {
                id,
                result: Ok((index, digest.to_string())),
            })
        })
        .collect()
}

/// Judges one poll: a divergence between any two voters at one index wins
/// over everything else; then an unreadable voter; then whether all are
/// at one index.
pub fn compare(voters: &[VoterDigest]) -> DigestVerdict {
    let answered: Vec<(u64, u64, &str)> = voters
        .iter()
        .filter_map(|v| v.result.as_ref().ok().map(|(i, d)| (v.id, *i, d.as_str())))
        .collect();
    for (k, (_, index, digest)) in answered.iter().enumerate() {
        if answered[k + 1..]
            .iter()
            .any(|(_, i, d)| i == index && d != digest)
        {
            return DigestVerdict::Differ {
                applied_index: *index,
                digests: answered
                    .iter()
                    .filter(|(_, i, _)| i == index)
                    .map(|(id, _, d)| (*id, d.to_string()))
                    .collect(),
            };
        }
    }
    if let Some(v) = voters.iter().find(|v| v.result.is_err()) {
        return DigestVerdict::Unreadable(format!(
            "voter {}: {}",
            v.id,
            v.result.as_ref().err().map_or("", |e| e.as_str())
        ));
    }
    match answered.first() {
        None => DigestVerdict::Unreadable("no voter listed".into()),
        Some((_, index, digest)) if answered.iter().all(|(_, i, _)| i == index) => {
            DigestVerdict::Agree {
                applied_index: *index,
                digest: digest.to_string(),
            }
        }
        Some(_) => DigestVerdict::NotAligned {
            indexes: answered.iter().map(|(id, i, _)| (*id, *i)).collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(id: u64, index: u64, digest: &str) -> VoterDigest {
        VoterDigest {
            id,
            result: Ok((index, digest.into())),
        }
    }

    #[test]
    fn equal_digests_at_one_index_agree() {
        let v = [at(1, 90, "aa"), at(2, 90, "aa"), at(3, 90, "aa")];
        assert_eq!(
            compare(&v),
            DigestVerdict::Agree {
                applied_index: 90,
                digest: "aa".into()
            }
        );
    }

    #[test]
    fn a_difference_at_one_index_is_a_divergence_even_if_a_third_lags() {
        let v = [at(1, 90, "aa"), at(2, 91, "cc"), at(3, 90, "bb")];
        assert_eq!(
            compare(&v),
            DigestVerdict::Differ {
                applied_index: 90,
                digests: vec![(1, "aa".into()), (3, "bb".into())]
            }
        );
        let down = VoterDigest {
            id: 2,
            result: Err("unreachable".into()),
        };
        let v = [at(1, 90, "aa"), down.clone(), at(3, 90, "bb")];
        assert!(matches!(compare(&v), DigestVerdict::Differ { .. }));
        let v = [at(1, 90, "aa"), down, at(3, 90, "aa")];
        assert_eq!(
            compare(&v),
            DigestVerdict::Unreadable("voter 2: unreachable".into())
        );
    }

    #[test]
    fn different_indexes_are_polled_again() {
        let v = [at(1, 90, "aa"), at(2, 91, "bb"), at(3, 90, "aa")];
        assert_eq!(
            compare(&v),
            DigestVerdict::NotAligned {
                indexes: vec![(1, 90), (2, 91), (3, 90)]
            }
        );
        assert!(matches!(compare(&[]), DigestVerdict::Unreadable(_)));
    }

    #[test]
    fn the_cli_json_parses() {
        let j = serde_json::json!({"voters": [
            {"id": 1, "addr": "https://10.0.0.11:7001", "applied_index": 7, "digest": "ab", "records": 3},
            {"id": 2, "addr": "https://10.0.0.12:7001", "error": "timed out"},
        ]});
        assert_eq!(
            parse(&j).unwrap(),
            vec![
                at(1, 7, "ab"),
                VoterDigest {
                    id: 2,
                    result: Err("timed out".into())
                }
            ]
        );
        assert!(parse(&serde_json::json!({})).is_err());
        assert!(parse(&serde_json::json!({"voters": [{"id": 1}]})).is_err());
    }
}
