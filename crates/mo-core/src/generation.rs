//! The MatrixOne kernel generations the operator runs, and what each changes for it: one row per
//! generation, read in the kernel's own source at its release tags (public repository
//! `matrixorigin/matrixone`; file names are the kernel's). Every decision that depends on a
//! kernel behaviour that moved between generations reads it here.
//!
//! A version the table cannot place (a nightly tag, a branch name, a private build) is no
//! generation: what depends on one then holds and says why, never guesses.

use crate::time::Millis;
use serde::{Deserialize, Serialize};

/// A kernel generation: the first release whose behaviour a row describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Generation {
    /// v1.2.x (2024): what the operator was built on.
    V1_2,
    /// v2.0.0: `CNStore.CommitID` 15 → 16, `CNStoreInfo.CommitID` 16 → 17 (the new
    /// `ShardServiceAddress` took the old numbers, `proto/logservice.proto`); the proxy moves
    /// sessions off Draining CNs every 5 s (`pkg/proxy/scaling.go`); `CHECK_HEALTH` and
    /// `GetReplicaCount` answered.
    V2_0,
    /// v2.1.0: a CN no longer aborts its running transactions when the TN's logtail reconnects
    /// (`pkg/vm/engine/disttae/logtail_consumer.go`).
    V2_1,
    /// v2.2.0: a transaction request to an unreachable TN is retried every 300 ms without a
    /// limit; one cut in flight answers 20638 (`pkg/txn/rpc/sender.go`). A proxy reloads its
    /// CN list every 2 s (`pkg/proxy/config.go`, was 5 s).
    V2_2,
    /// v3.0.0 to v3.0.14.
    V3_0,
    /// v3.0.15: that retry is bounded to 30 s: a commit not yet sent survives a TN restart
    /// shorter than that.
    V3_0_15,
    /// v4.0: a dead CN instance's lock-allocator entry lingers about 20 s (two keep-bind
    /// timeouts, `pkg/lockservice/lock_table_allocator.go`; was about 10 s).
    V4_0,
    /// v4.2.0: `CanRestartService` true only with no lock admission in flight; the scheduler
    /// skips Draining CNs; a CN waits at start until HAKeeper lists it with its own `CommitID`
    /// (`pkg/cnservice/server_cluster.go`).
    V4_2,
}

/// How a commit sent while the TN is unreachable fares (`pkg/txn/rpc/sender.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitRetry {
    /// It fails at once (no client retry).
    None,
    /// Retried every 300 ms for as long as it takes.
    Unbounded,
    /// Retried every 300 ms for up to this long.
    Within(Millis),
}

/// What one generation changes for the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    pub generation: Generation,
    /// The first release of the row.
    pub since: (u32, u32, u32),
    /// Field numbers of `CommitID` in `CNStore` (GetClusterDetails) and `CNStoreInfo`
    /// (GetClusterState), as a HAKeeper of this generation encodes them.
    pub cn_store_commit_field: u32,
    pub cn_store_info_commit_field: u32,
    /// How often a proxy moves sessions off Draining CNs.
    pub proxy_scaling: Millis,
    /// How often a proxy reloads its CN list from HAKeeper.
    pub proxy_refresh: Millis,
    /// A CN aborts every running transaction when the TN's logtail reconnects.
    pub tn_reconnect_aborts_txns: bool,
    pub commit_retry: CommitRetry,
    /// How long a dead CN instance's lock-allocator entry lingers.
    pub allocator_entry_linger: Millis,
    /// A CN answers `GetReplicaCount` (v1.2 answers "not supported": no shard service).
    pub replica_count: bool,
    /// `CanRestartService` waits for lock admissions in flight too.
    pub strict_can_restart: bool,
    /// How long a statement whose transaction touched a lock table's old bind keeps retrying
    /// before it fails with 20702 ("lock table bind changed"), when a hand-over moves the table
    /// under it. From v4.0 such a transaction is fenced (`pkg/lockservice/txn.go`,
    /// `fenceByBindChanged`) and the lock operator's retry is bounded
    /// (`pkg/sql/colexec/lockop/lock_op.go`, `defaultMaxWaitTimeOnRetryBackendLock`, 10 s):
    /// every statement on the table in flight while it moves fails, whatever the operator
    /// does. None before: the statement retries on the new bind and succeeds.
    pub hand_over_fences_after: Option<Millis>,
}

const fn row(generation: Generation, since: (u32, u32, u32)) -> Facts {
    Facts {
        generation,
        since,
        cn_store_commit_field: 16,
        cn_store_info_commit_field: 17,
        proxy_scaling: Millis(5_000),
        proxy_refresh: Millis(2_000),
        tn_reconnect_aborts_txns: false,
        commit_retry: CommitRetry::Unbounded,
        allocator_entry_linger: Millis(10_000),
        replica_count: true,
        strict_can_restart: false,
        hand_over_fences_after: None,
    }
}

/// Every generation, oldest first.
pub const TABLE: [Facts; 8] = [
    Facts {
        cn_store_commit_field: 15,
        cn_store_info_commit_field: 16,
        proxy_scaling: Millis(3_000),
        proxy_refresh: Millis(5_000),
        tn_reconnect_aborts_txns: true,
        commit_retry: CommitRetry::None,
        replica_count: false,
        ..row(Generation::V1_2, (1, 2, 0))
    },
    Facts {
        proxy_refresh: Millis(5_000),
        tn_reconnect_aborts_txns: true,
        commit_retry: CommitRetry::None,
        ..row(Generation::V2_0, (2, 0, 0))
    },
    Facts {
        proxy_refresh: Millis(5_000),
        commit_retry: CommitRetry::None,
        ..row(Generation::V2_1, (2, 1, 0))
    },
    row(Generation::V2_2, (2, 2, 0)),
    row(Generation::V3_0, (3, 0, 0)),
    Facts {
        commit_retry: CommitRetry::Within(Millis(30_000)),
        ..row(Generation::V3_0_15, (3, 0, 15))
    },
    Facts {
        commit_retry: CommitRetry::Within(Millis(30_000)),
        allocator_entry_linger: Millis(20_000),
        hand_over_fences_after: Some(Millis(10_000)),
        ..row(Generation::V4_0, (4, 0, 0))
    },
    Facts {
        commit_retry: CommitRetry::Within(Millis(30_000)),
        allocator_entry_linger: Millis(20_000),
        strict_can_restart: true,
        hand_over_fences_after: Some(Millis(10_000)),
        ..row(Generation::V4_2, (4, 2, 0))
    },
];

/// `vX.Y.Z` (a `v`, optional; a pre-release or build suffix after `-` or `+` ignored) as
/// numbers; None for anything else.
pub fn release(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.strip_prefix('v').unwrap_or(version);
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    let version = (next()?, next()?, next()?);
    parts.next().is_none().then_some(version)
}

impl Generation {
    /// The generation of release `version` (`v3.0.15`, `3.0.15`, `v4.0.0-rc2`); None for a
    /// version the table cannot place (older than v1.2, or not a release).
    pub fn of(version: &str) -> Option<Generation> {
        let v = release(version)?;
        TABLE
            .iter()
            .rev()
            .find(|f| v >= f.since)
            .filter(|_| v >= (1, 2, 0))
            .map(|f| f.generation)
    }

    pub fn facts(self) -> &'static Facts {
        TABLE
            .iter()
            .find(|f| f.generation == self)
            .expect("every generation has a row")
    }
}

/// The lock allocator's silent-entry linger the drain's "previous process" wait was sized for
/// (v1.2 to v3.0: an entry silent for `keepBindTimeout`, 10 s).
const BASE_ALLOCATOR_LINGER: Millis = Millis(10_000);

/// How much longer than v1.2's the lock allocator of release `version` keeps the entry of a
/// CN process that went silent: v4.0 on, an entry goes only once silent for twice
/// `keepBindTimeout` (`keepBindGraceFactor`, `pkg/lockservice/lock_table_allocator.go`), 10 s
/// more. For a version the table cannot place, the most any generation adds: the wait this
/// lengthens only ever holds longer.
pub fn allocator_linger_beyond_v1_2(version: &str) -> Millis {
    let extra = |f: &Facts| {
        Millis(
            f.allocator_entry_linger
                .0
                .saturating_sub(BASE_ALLOCATOR_LINGER.0),
        )
    };
    match Generation::of(version) {
        Some(g) => extra(g.facts()),
        None => TABLE.iter().map(extra).max().unwrap_or_default(),
    }
}

/// A release as the kernel's tags name them: `vX.Y.Z` or `vX.Y.Z-rcN`, ordered (a release
/// candidate before its release).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tag(u32, u32, u32, u32);

const FINAL: u32 = u32::MAX;

impl Tag {
    /// Only the two shapes of the kernel's release tags: anything else (a hotfix tag, a hash, a
    /// nightly) may carry another catalog than the release it names.
    fn parse(version: &str) -> Option<Tag> {
        let core = version.strip_prefix('v').unwrap_or(version);
        let (core, pre) = match core.split_once('-') {
            Some((core, rc)) => (core, rc.strip_prefix("rc")?.parse::<u32>().ok()?),
            None => (core, FINAL),
        };
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let tag = Tag(parts.next()??, parts.next()??, parts.next()??, pre);
        parts.next().is_none().then_some(tag)
    }
}

/// The catalog version each kernel release brings: the last step of its upgrade framework
/// (`pkg/bootstrap/versions/vX_Y_Z`, `Version` of the newest handler), read at every release
/// tag of `matrixorigin/matrixone` from v1.2.0 to v4.2.0; the handlers' `VersionOffset` does
/// not change within a row (checked for v3.0.15 to v3.0.18). A CN whose release brings an
/// older catalog than the one the cluster's catalog reached exits fatally at start ("cannot
/// startup a old version", `pkg/bootstrap/service_upgrade.go`); the catalog only moves
/// forward, through every step in between, which the first CN of a newer release runs.
const CATALOGS: [(Tag, Tag, (u32, u32, u32)); 17] = [
    (Tag(1, 2, 0, FINAL), Tag(1, 2, 0, FINAL), (1, 2, 0)),
    (Tag(1, 2, 1, FINAL), Tag(1, 2, 1, FINAL), (1, 2, 1)),
    (Tag(1, 2, 2, FINAL), Tag(1, 2, 2, FINAL), (1, 2, 2)),
    (Tag(1, 2, 3, FINAL), Tag(1, 2, 4, FINAL), (1, 2, 3)),
    (Tag(2, 0, 0, FINAL), Tag(2, 0, 0, FINAL), (2, 0, 0)),
    (Tag(2, 0, 1, FINAL), Tag(2, 0, 1, FINAL), (2, 0, 1)),
    (Tag(2, 0, 2, FINAL), Tag(2, 0, 2, FINAL), (2, 0, 2)),
    (Tag(2, 0, 3, FINAL), Tag(2, 0, 5, FINAL), (2, 0, 3)),
    (Tag(2, 1, 0, FINAL), Tag(2, 1, 1, FINAL), (2, 1, 0)),
    (Tag(2, 2, 0, FINAL), Tag(2, 2, 2, FINAL), (2, 2, 0)),
    (Tag(3, 0, 0, FINAL), Tag(3, 0, 9, FINAL), (3, 0, 0)),
    (Tag(3, 0, 10, FINAL), Tag(3, 0, 14, FINAL), (3, 0, 2)),
    (Tag(3, 0, 15, FINAL), Tag(3, 0, 18, FINAL), (3, 0, 3)),
    (Tag(4, 0, 0, 1), Tag(4, 0, 0, 2), (4, 0, 0)),
    (Tag(4, 0, 0, 3), Tag(4, 0, 0, 4), (4, 0, 1)),
    (Tag(4, 1, 0, FINAL), Tag(4, 1, 4, FINAL), (4, 0, 1)),
    (Tag(4, 2, 0, FINAL), Tag(4, 2, 0, FINAL), (4, 0, 6)),
];

/// The catalog version release `version` brings (see [`CATALOGS`]); None for a version the
/// table cannot place: not a release tag, or a release newer than the table.
pub fn catalog(version: &str) -> Option<(u32, u32, u32)> {
    let tag = Tag::parse(version)?;
    CATALOGS
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&tag))
        .map(|(_, _, catalog)| *catalog)
}

pub fn named(catalog: Option<(u32, u32, u32)>) -> String {
    match catalog {
        Some((x, y, z)) => format!("catalog {x}.{y}.{z}"),
        None => "a catalog the operator cannot place".into(),
    }
}

/// Whether a CN may start on `version` in a cluster whose CNs have run `ran` (every version,
/// in the order each first ran). The catalog only moves forward, so `version` must bring a
/// catalog at least as new as that of every version run after it (every version run, if it
/// never ran here). A version run before whose catalog, or a later one's, cannot be placed is
/// refused: the operator cannot tell whether the later CNs moved the catalog past it. A
/// version never run here that the table cannot place is the one thing let through: the
/// operator cannot tell its direction, and the kernel itself stops a CN that would go back.
pub fn cn_may_run(version: &str, ran: &[String]) -> Result<(), String> {
    let since = ran.iter().position(|v| v == version);
    let later = match since {
        Some(i) => &ran[i + 1..],
        None => ran,
    };
    let wanted = catalog(version);
    for other in later.iter().filter(|v| *v != version) {
        let reached = catalog(other);
        match (wanted, reached) {
            (Some(w), Some(r)) if w >= r => {}
            (None, _) | (_, None) if since.is_none() => {}
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{version} ({}) cannot run on a catalog that {other}'s CNs moved to {}: \
                     the kernel stops a CN of an older catalog (\"cannot startup a old version\")",
                    named(wanted),
                    named(reached)
                ));
            }
            _ => {
                return Err(format!(
                    "{version} ran before {other}, and the operator cannot tell whether {other}'s \
                     CNs moved the catalog past {version}'s ({} / {}): a CN of an older catalog \
                     exits at start",
                    named(wanted),
                    named(reached)
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_find_their_generation() {
        assert_eq!(Generation::of("v1.2.4"), Some(Generation::V1_2));
        assert_eq!(Generation::of("v2.0.3"), Some(Generation::V2_0));
        assert_eq!(Generation::of("v2.2.1"), Some(Generation::V2_2));
        assert_eq!(Generation::of("v3.0.14"), Some(Generation::V3_0));
        assert_eq!(Generation::of("v3.0.15"), Some(Generation::V3_0_15));
        assert_eq!(Generation::of("3.0.18"), Some(Generation::V3_0_15));
        assert_eq!(Generation::of("v4.0.0-rc2"), Some(Generation::V4_0));
        assert_eq!(Generation::of("v4.1.4"), Some(Generation::V4_0));
        assert_eq!(Generation::of("v4.2.0"), Some(Generation::V4_2));
        for unknown in ["v1.1.9", "nightly-0bbda669", "main", "v3.0", "latest", ""] {
            assert_eq!(Generation::of(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn the_commit_id_moved_from_v2_on() {
        assert_eq!(Generation::V1_2.facts().cn_store_commit_field, 15);
        assert_eq!(Generation::V1_2.facts().cn_store_info_commit_field, 16);
        for g in &TABLE[1..] {
            assert_eq!(g.cn_store_commit_field, 16, "{:?}", g.generation);
            assert_eq!(g.cn_store_info_commit_field, 17, "{:?}", g.generation);
        }
        assert!(TABLE.windows(2).all(|w| w[0].since < w[1].since));
    }

    #[test]
    fn every_release_tag_finds_its_catalog() {
        let cases = [
            ("v1.2.0", Some((1, 2, 0))),
            ("v1.2.3", Some((1, 2, 3))),
            ("v1.2.4", Some((1, 2, 3))),
            ("v2.0.4", Some((2, 0, 3))),
            ("v2.1.1", Some((2, 1, 0))),
            ("v2.2.2", Some((2, 2, 0))),
            ("v3.0.9", Some((3, 0, 0))),
            ("v3.0.10", Some((3, 0, 2))),
            ("v3.0.14", Some((3, 0, 2))),
            ("v3.0.15", Some((3, 0, 3))),
            ("3.0.18", Some((3, 0, 3))),
            ("v4.0.0-rc2", Some((4, 0, 0))),
            ("v4.0.0-rc3", Some((4, 0, 1))),
            ("v4.1.4", Some((4, 0, 1))),
            ("v4.2.0", Some((4, 0, 6))),
            // Not release tags, or newer than the table.
            ("v4.0.0", None),
            ("v3.0.19", None),
            ("v3.0.4-hotfix-20251114", None),
            ("v1.1.9", None),
            ("f2dd397", None),
            ("v2", None),
        ];
        for (version, expected) in cases {
            assert_eq!(catalog(version), expected, "{version}");
        }
        assert!(
            CATALOGS
                .windows(2)
                .all(|w| w[0].1 < w[1].0 && w[0].2 <= w[1].2)
        );
    }

    fn ran(versions: &[&str]) -> Vec<String> {
        versions.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn a_cn_never_goes_back_to_an_older_catalog() {
        // Forward, across generations and catalogs.
        assert_eq!(cn_may_run("v3.0.15", &ran(&["v1.2.4"])), Ok(()));
        assert_eq!(cn_may_run("v4.0.0-rc2", &ran(&["v3.0.15"])), Ok(()));
        // Back within one catalog: v1.2.3 and v1.2.4 both bring 1.2.3.
        assert_eq!(cn_may_run("v1.2.3", &ran(&["v1.2.3", "v1.2.4"])), Ok(()));
        // Back across catalogs, after the newer CNs ran: refused, both named.
        let refused = cn_may_run("v3.0.15", &ran(&["v3.0.15", "v4.0.0-rc2"])).unwrap_err();
        assert!(
            refused.contains("catalog 3.0.3") && refused.contains("catalog 4.0.0"),
            "{refused}"
        );
        // A downgrade to a release never run here, older than what ran: refused.
        assert!(cn_may_run("v3.0.12", &ran(&["v3.0.15"])).is_err());
        // A version never run here that the table cannot place: its direction is unknown.
        assert_eq!(cn_may_run("nightly-0bbda669", &ran(&["v3.0.15"])), Ok(()));
        // A return to a version run before, past one that cannot be placed (or from one that
        // cannot be placed): refused, never guessed.
        assert!(cn_may_run("v3.0.15", &ran(&["v3.0.15", "nightly-0bbda669"])).is_err());
        assert!(cn_may_run("v1", &ran(&["v1", "v2"])).is_err());
        // The version itself, or nothing after it.
        assert_eq!(cn_may_run("v2", &ran(&["v1", "v2"])), Ok(()));
        assert_eq!(cn_may_run("v4.2.0", &ran(&[])), Ok(()));
    }
}
