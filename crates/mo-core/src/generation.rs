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
        ..row(Generation::V4_0, (4, 0, 0))
    },
    Facts {
        commit_retry: CommitRetry::Within(Millis(30_000)),
        allocator_entry_linger: Millis(20_000),
        strict_can_restart: true,
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
}
