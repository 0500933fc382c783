//! Model rules, each tested on its own (defaults cite `shared/reference/matrixone.md`).

use super::workload::LockResult;
use super::*;
use crate::scenario::Scenario;
use proptest::prelude::*;

const BASE: &str = "
name: rules
duration: 20m
topology:
  version: v1
  cn_groups: [{name: cn, replicas: 2}]
workload: {clients: 4, txn_rate: 10, tables: [a, b]}
";

fn sim(yaml: &str) -> Simulation {
    let scenario = Scenario::from_yaml(yaml).expect("test scenario parses");
    Simulation::new(
        scenario,
        RunOptions {
            record_events: true,
            audit: true,
            ..RunOptions::default()
        },
    )
}

fn secs(s: u64) -> Millis {
    Millis::from_secs(s)
}

fn run_to(s: &mut Simulation, t: Millis) {
    s.run_until(t, &mut |_| {});
}

fn pod(s: &Simulation, name: &str) -> PodId {
    s.pod_by_name[name]
}

fn crash(s: &mut Simulation, name: &str) {
    let p = pod(s, name);
    s.crash_process(p, Cause::Involuntary, false);
}

/// Whether the running lock allocator has an entry for some process of that UUID.
fn allocator_knows(s: &Simulation, uuid: &str) -> bool {
    s.tn.allocator.services.values().any(|e| e.uuid == uuid)
}

fn answer(s: &Simulation, uuid: &str) -> mo_core::RestartAnswer {
    s.tn.allocator.restart_answer(uuid, s.now)
}

/// A transaction `x` on `cn` (its client already told) that locks `table` and holds the lock.
fn holding_lock(s: &mut Simulation, cn: &str, x: TxnId, table: usize) {
    let p = pod(s, cn);
    let on = Instance {
        pod: p,
        epoch: s.cns[&p].epoch,
    };
    let txn = Txn {
        reported: true,
        ..Txn::new(0, on, s.now, vec![table])
    };
    s.txns.insert(x, txn);
    let LockResult::Granted(held) = s.acquire_lock(x, table) else {
        panic!("{cn} locks table {table}");
    };
    s.txns.get_mut(&x).unwrap().locks.push(held);
}

fn failures(s: &Simulation) -> u64 {
    s.counts.failed_definite + s.counts.unknown
}

#[test]
fn two_of_three_log_replicas_down_means_no_commit() {
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    assert!(
        s.counts.committed > 0,
        "the workload commits while LOG is healthy"
    );
    crash(&mut s, "log-1");
    crash(&mut s, "log-2");
    // Let appends already accepted by the WAL finish.
    run_to(&mut s, secs(10) + Millis(50));
    let committed = s.counts.committed;
    assert!(!s.shards[0].can_commit() && !s.shards[1].can_commit());
    run_to(&mut s, secs(100));
    assert_eq!(
        s.counts.committed, committed,
        "no commit without a majority"
    );
    assert!(!s.hakeeper_available());
}

#[test]
fn one_of_three_log_replicas_down_keeps_committing() {
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    crash(&mut s, "log-0"); // the leader: an election follows
    run_to(&mut s, secs(11));
    assert!(!s.shards[1].can_commit(), "no leader during the election");
    run_to(&mut s, secs(20));
    assert!(s.shards[1].can_commit());
    let committed = s.counts.committed;
    run_to(&mut s, secs(60));
    assert!(s.counts.committed > committed);
    assert!(s.tn_fatal_exit_times.is_empty());
}

#[test]
fn wal_fatal_exactly_three_minutes_ten_seconds_after_the_first_blocked_append() {
    // v1.2.4: the first append waits 10 s, then tries of 10 s are retried back to back for
    // 3 min; the panic comes at the end of the try that crosses them.
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    crash(&mut s, "log-1");
    crash(&mut s, "log-2");
    run_to(&mut s, secs(200) - Millis(1));
    assert!(
        s.tn_fatal_exit_times.is_empty(),
        "tries go on for 10 s + 3 min"
    );
    run_to(&mut s, secs(200));
    assert_eq!(s.tn_fatal_exit_times, vec![secs(200)]);
    // CrashLoopBackOff 10 s, then the TN waits 2 min for HAKeeper and exits again;
    // the next backoff doubles to 20 s.
    run_to(&mut s, secs(500));
    assert_eq!(
        s.tn_fatal_exit_times,
        vec![secs(200), secs(200 + 10 + 120), secs(330 + 20 + 120)]
    );
}

#[test]
fn wal_tolerance_is_configurable() {
    let yaml = format!("{BASE}timings: {{wal_total_timeout: 5m}}\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    crash(&mut s, "log-1");
    crash(&mut s, "log-2");
    run_to(&mut s, secs(400));
    assert_eq!(s.tn_fatal_exit_times.first(), Some(&secs(320)));
}

#[test]
fn lockers_of_a_dead_owner_stall_until_the_binds_move_at_the_allocators_first_check() {
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("tables: [a, b]", "tables: [a]");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let owner = Instance {
        pod: pod(&s, "cn-1"),
        epoch: s.pods[pod(&s, "cn-1")].epoch,
    };
    assert_eq!(s.tn.allocator.binds["a"].owner, owner);
    let in_flight = s.txns.len() as u64;
    crash(&mut s, "cn-1");
    let died = s.now;
    let moves = s.bind_invalidation_at(died);
    assert!(
        moves >= died + secs(10) && moves < died + secs(20),
        "10-20 s after the owner went silent: died {died}, moves {moves}"
    );
    // Until the bind moves, DML on the table stalls: new lockers ask again every second, and
    // only the transactions that already held a lock on it (in flight at the crash) fail.
    run_to(&mut s, died + secs(2));
    let stalled = s.counts.committed;
    run_to(&mut s, moves - Millis(1));
    assert_eq!(
        s.tn.allocator.binds["a"].owner, owner,
        "still bound to the dead owner"
    );
    assert_eq!(s.counts.committed, stalled, "no commit on the table");
    assert!(failures(&s) <= in_flight, "{:?}", s.errors_by_kind);
    run_to(&mut s, moves + secs(1));
    let cn0 = pod(&s, "cn-0");
    assert_eq!(
        s.tn.allocator.binds["a"].owner.pod, cn0,
        "rebound to the live CN"
    );
    let failed = failures(&s);
    run_to(&mut s, secs(60));
    assert_eq!(failures(&s), failed, "no failure once the bind has moved");
}

#[test]
fn from_v4_0_the_allocator_waits_for_twice_the_silence() {
    // `keepBindGraceFactor` (v4.0.0-rc1 on): a service is taken once silent for 2 x 10 s,
    // at the allocator's next round; the allocator is the TN's, so the TN's release decides.
    let mut s = sim(BASE);
    s.tn.allocator.checks_since = secs(5);
    let tn = s.tn.pod;
    for (version, at) in [
        ("v3.0.15", secs(25)),
        ("v4.0.0-rc2", secs(35)),
        ("v4.2.0", secs(35)),
    ] {
        s.pods[tn].version = version.into();
        assert_eq!(s.bind_invalidation_at(secs(10)), at, "{version}");
    }
}

#[test]
fn the_invalidation_check_runs_on_the_allocators_own_timer() {
    // `checkInvalidBinds`: a timer of keepBindTimeout (10 s) from the allocator's start, so
    // an owner silent since t is taken at the first round at or after t + 10 s.
    let mut s = sim(BASE);
    s.tn.allocator.checks_since = secs(5);
    assert_eq!(s.bind_invalidation_at(secs(10)), secs(25));
    assert_eq!(s.bind_invalidation_at(secs(15)), secs(25));
    assert_eq!(s.bind_invalidation_at(secs(15) + Millis(1)), secs(35));
    assert_eq!(
        s.bind_invalidation_at(secs(0)),
        secs(15),
        "never before the first round"
    );
}

#[test]
fn a_cn_told_to_restart_refuses_its_own_new_writes_for_good() {
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-0}}]\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    assert!(allocator_knows(&s, &uuid), "cn-1 has locked");
    let instance = Instance {
        pod: cn1,
        epoch: s.cns[&cn1].epoch,
    };
    let txn = |locks: Vec<HeldLock>| Txn {
        client: 0,
        cn: instance,
        created_at: Millis::ZERO,
        tables: vec![0],
        next_stmt: 0,
        stage: TxnStage::Statements,
        locks,
        tn_wait_deadline: None,
        commit_sent_at: Millis::ZERO,
        timeout_armed: false,
        reported: true,
    };
    s.txns.insert(900_001, txn(vec![]));
    let LockResult::Granted(held) = s.acquire_lock(900_001, 0) else {
        panic!("an unmarked CN locks a table another CN owns");
    };
    s.txns.get_mut(&900_001).unwrap().locks.push(held);
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(11) + Millis(1));
    assert_ne!(s.cns[&cn1].restart_mode, RestartMode::None);
    for at in [secs(12), secs(40)] {
        run_to(&mut s, at);
        s.txns.insert(900_002, txn(vec![]));
        match s.acquire_lock(900_002, 1) {
            LockResult::Failed(error, Cause::Voluntary) => {
                assert!(error.contains("20635"), "{error}")
            }
            _ => panic!("a new transaction of a marked CN gets 20635 at {at}"),
        }
        s.txns.remove(&900_002);
    }
    assert!(
        matches!(s.acquire_lock(900_001, 1), LockResult::Granted(_)),
        "a transaction it already holds locks for goes on"
    );
}

#[test]
fn a_uuid_the_allocator_does_not_know_is_answered_can_restart_and_its_cn_never_hears() {
    let yaml = BASE.replace("clients: 4", "clients: 0, background: null");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    assert!(!allocator_knows(&s, &uuid), "cn-1 never locked");
    s.set_restart_service(&uuid).unwrap();
    let answer = answer(&s, &uuid);
    assert!(answer.can_restart, "(true, 0) at once");
    assert_eq!(answer.remaining_txns, 0);
    run_to(&mut s, secs(30));
    assert_eq!(
        s.cns[&cn1].restart_mode,
        RestartMode::None,
        "the CN never learns of a request its allocator could not place"
    );
}

#[test]
fn a_locker_of_a_handing_over_owner_waits_for_as_long_as_the_hand_over_takes() {
    // v1.2.4 `lock_op.go` `canRetryLock`: "retry for CN rolling restart" sleeps 1 s and asks
    // again, with no deadline; the wait ends with the hand-over, never in a failure.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("tables: [a, b]", "tables: [a]");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let cn0 = pod(&s, "cn-0");
    let uuid = s.cns[&cn1].uuid.clone();
    let waiter = Txn::new(
        0,
        Instance {
            pod: cn0,
            epoch: s.cns[&cn0].epoch,
        },
        Millis::ZERO,
        vec![0],
    );
    s.txns.insert(900_002, waiter);
    // A holder that keeps cn-1 handing over for the whole test.
    s.cns.get_mut(&cn1).unwrap().holders.insert(900_001);
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(12));
    s.stmt_done(0, 900_002);
    run_to(&mut s, secs(60));
    let txn = &s.txns[&900_002];
    assert!(
        !txn.reported && txn.locks.is_empty(),
        "still waiting after 48 s"
    );
    assert!(
        !s.errors_by_kind.keys().any(|k| k.contains("lock wait")),
        "{:?}",
        s.errors_by_kind
    );
}

#[test]
fn handshake_refuses_new_locks_but_lets_active_transactions_finish() {
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("tables: [a, b]", "tables: [a]");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let cn0 = pod(&s, "cn-0");
    let uuid = s.cns[&cn1].uuid.clone();
    // An active transaction (already holding a lock on cn-1's table) and a new one.
    let cn0_instance = Instance {
        pod: cn0,
        epoch: s.cns[&cn0].epoch,
    };
    for x in [900_001, 900_002] {
        s.txns.insert(
            x,
            Txn {
                reported: true,
                ..Txn::new(0, cn0_instance, Millis::ZERO, vec![0])
            },
        );
    }
    s.cns.get_mut(&cn1).unwrap().holders.insert(900_001);
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(11) + Millis(1));
    assert_eq!(s.cns[&cn1].restart_mode, RestartMode::Waiting);
    // A transaction begun after the CN learnt of the restart is not admitted.
    s.txns.get_mut(&900_002).unwrap().created_at = s.now;
    assert!(matches!(s.acquire_lock(900_002, 0), LockResult::Retry));
    assert!(matches!(s.acquire_lock(900_001, 0), LockResult::Granted(_)));
    assert!(!answer(&s, &uuid).can_restart);
    run_to(&mut s, secs(12) + Millis(1));
    assert_eq!(
        answer(&s, &uuid),
        mo_core::RestartAnswer {
            can_restart: false,
            remaining_txns: 1
        },
        "the keepalive after the CN learnt reports what it still counts"
    );
    // The active transactions end: the CN reports unlock success at its next keepalive, and
    // the allocator takes its tables back.
    s.txns.remove(&900_001);
    s.txns.remove(&900_002);
    s.cns.get_mut(&cn1).unwrap().holders.remove(&900_001);
    s.check_unlock(cn1);
    assert_eq!(s.cns[&cn1].restart_mode, RestartMode::UnlockSuccess);
    assert!(
        !answer(&s, &uuid).can_restart,
        "the allocator has not heard yet"
    );
    run_to(&mut s, secs(13) + Millis(1));
    assert_eq!(
        answer(&s, &uuid),
        mo_core::RestartAnswer {
            can_restart: true,
            remaining_txns: 0
        }
    );
    run_to(&mut s, secs(30));
    assert_eq!(s.tn.allocator.binds["a"].owner.pod, cn0, "others rebind");
    // The marked CN refuses its own sessions' new transactions (20635, kernel's
    // `txn/client/operator.go`): that is the kernel's rule, and why the operator moves sessions
    // first. Nothing else fails.
    let others: Vec<_> = s
        .errors_by_kind
        .iter()
        .filter(|(text, _)| !text.contains("20635"))
        .collect();
    assert!(
        others.is_empty(),
        "the handshake costs no other transaction: {others:?}"
    );
    assert_eq!(s.cns[&cn1].confirmed_epoch, Some(s.cns[&cn1].epoch));
}

#[test]
fn a_restarted_cn_is_a_second_entry_and_either_entry_answers_until_the_old_one_goes() {
    // v1.2.4: the allocator keys lock services by service id (start time + UUID) and answers
    // `CanRestartService(uuid)` from whichever entry with that UUID its map yields first.
    let yaml =
        format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}, {{table: b, owner: cn-1}}]\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(8));
    assert!(answer(&s, &uuid).can_restart, "the old process handed over");
    crash(&mut s, "cn-1");
    let died = s.now;
    s.start_process(cn1);
    run_to(&mut s, died + secs(10) + Millis(500));
    assert_eq!(s.cns[&cn1].phase, CnPhase::Running);
    let new = Instance {
        pod: cn1,
        epoch: s.cns[&cn1].epoch,
    };
    // The new process locks through the allocator (a client session on it): a second entry.
    s.tn.allocator.register(new, &uuid);
    let entries =
        s.tn.allocator
            .services
            .values()
            .filter(|e| e.uuid == uuid)
            .count();
    assert_eq!(entries, 2, "the old entry is still there");
    let answers: BTreeSet<bool> = (0..64)
        .map(|i| {
            s.tn.allocator
                .restart_answer(&uuid, s.now + Millis(i))
                .can_restart
        })
        .collect();
    assert_eq!(
        answers,
        BTreeSet::from([false, true]),
        "the old entry's 'can restart' answers for the new process part of the time"
    );
    run_to(&mut s, died + secs(25));
    assert_eq!(
        s.tn.allocator
            .services
            .keys()
            .filter(|i| i.pod == cn1)
            .collect::<Vec<_>>(),
        vec![&new],
        "the old entry went at an invalidation round"
    );
    assert_eq!(
        answer(&s, &uuid),
        mo_core::RestartAnswer {
            can_restart: false,
            remaining_txns: -1
        },
        "only the new, unmarked entry answers"
    );
}

#[test]
fn a_second_restart_request_after_can_restart_wedges_the_entry_for_as_long_as_the_cn_runs() {
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n");
    let mut s = sim(&yaml.replace("clients: 4", "clients: 0"));
    run_to(&mut s, secs(5));
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(8));
    let confirmed = mo_core::RestartAnswer {
        can_restart: true,
        remaining_txns: 0,
    };
    assert_eq!(answer(&s, &uuid), confirmed);
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(120));
    assert_eq!(
        answer(&s, &uuid),
        mo_core::RestartAnswer {
            can_restart: false,
            remaining_txns: -1
        },
        "waiting again, its keepalives refused: never 'can restart' while the process runs"
    );
    crash(&mut s, "cn-1");
    run_to(&mut s, secs(145));
    assert_eq!(
        answer(&s, &uuid),
        confirmed,
        "once the process is gone its entry goes, and an unknown UUID answers (true, 0)"
    );
}

#[test]
fn a_restarted_cn_takes_no_bind_over_and_its_old_binds_stall_their_lockers_until_invalidated() {
    // v1.2.4: a restarted CN is a new service id; `getLocalLockTable` answers "bind changed"
    // to lockers of its old binds, which retry until the allocator invalidates them.
    let yaml =
        format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\ntimings: {{cn_start: 2s}}\n")
            .replace("tables: [a, b]", "tables: [a]");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let old = s.tn.allocator.binds["a"].owner;
    assert_eq!(old.pod, cn1);
    crash(&mut s, "cn-1");
    let died = s.now;
    let moves = s.bind_invalidation_at(died);
    s.start_process(cn1);
    run_to(&mut s, moves - Millis(1));
    assert_eq!(
        s.cns[&cn1].phase,
        CnPhase::Running,
        "restarted within the window"
    );
    assert_eq!(
        s.tn.allocator.binds["a"].owner, old,
        "the new instance took nothing over"
    );
    let stalled = s.counts.committed;
    run_to(&mut s, moves + secs(5));
    assert_ne!(
        s.tn.allocator.binds["a"].owner, old,
        "rebound after invalidation"
    );
    assert!(
        s.counts.committed > stalled,
        "DML goes on once the bind moved"
    );
}

#[test]
fn remain_txn_counts_the_marked_cns_own_transactions_that_hold_locks_elsewhere() {
    // v1.2.4 `service.go` `Lock` puts every transaction of the CN that locks anything in its
    // `activeTxnHolder`, which "unlock success" waits for and `RemainTxnInService` reports.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-0}}]\n")
        .replace("clients: 4", "clients: 0");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    let x = 900_300;
    holding_lock(&mut s, "cn-1", x, 0);
    assert!(
        !s.cns[&cn1].holders.contains(&x),
        "not a holder of cn-1's own tables"
    );
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(13));
    assert_eq!(
        answer(&s, &uuid),
        mo_core::RestartAnswer {
            can_restart: false,
            remaining_txns: 1
        }
    );
    s.txns.remove(&x);
    s.cns.get_mut(&pod(&s, "cn-0")).unwrap().holders.remove(&x);
    s.check_unlock(cn1);
    run_to(&mut s, secs(15));
    assert!(answer(&s, &uuid).can_restart);
}

#[test]
fn locks_of_a_crashed_requester_stay_counted_by_their_owner_for_a_minute_or_two() {
    // v1.2.4 `service_remote.go` `unlockTimeoutRemoteTxn`: every `RemoteLockTimeout` (1 min)
    // the owner releases the transactions of requesters silent that long that fail validation.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("clients: 4", "clients: 0");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let x = 900_400;
    holding_lock(&mut s, "cn-0", x, 0);
    crash(&mut s, "cn-0");
    let died = s.now;
    s.txns.remove(&x);
    assert!(
        s.active_txns(cn1).contains(&x),
        "the owner still counts the dead requester's transaction"
    );
    let released = s.orphan_check_at(cn1, died);
    assert!(released >= died + secs(60) && released < died + secs(120));
    run_to(&mut s, released - Millis(1));
    assert!(s.active_txns(cn1).contains(&x));
    run_to(&mut s, released + Millis(1));
    assert!(
        !s.active_txns(cn1).contains(&x),
        "released at the orphan check"
    );
}

#[test]
fn after_a_tn_restart_a_lock_owner_keeps_counting_remote_holders_it_never_hears_unlock() {
    // v1.2.4: the new allocator refuses the owner's keepalive, the owner drops its lock tables,
    // and the unlock a requester sends under the old bind is refused (`handleRemoteUnlock`):
    // the transaction stays in the owner's `activeTxnHolder` for as long as the requester runs.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("clients: 4", "clients: 0");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    let x = 900_500;
    holding_lock(&mut s, "cn-0", x, 0);
    let tn = pod(&s, "tn-0");
    s.crash_process(tn, Cause::Involuntary, true);
    run_to(&mut s, secs(40));
    assert_eq!(s.tn.phase, TnPhase::Running, "the TN came back");
    assert!(s.cns[&cn1].stale_holders.contains_key(&x));
    // The transaction ends (it aborts at COMMIT: its bind was lost); the owner still counts it.
    let txn = s.txns.remove(&x).unwrap();
    s.release_locks(x, &txn);
    assert!(s.active_txns(cn1).contains(&x));
    run_to(&mut s, secs(400));
    assert!(s.active_txns(cn1).contains(&x), "for as long as cn-0 runs");
    // Read as the operator reads it while cn-1 drains: the holder is listed, and no CN runs it.
    s.hakeeper
        .cns
        .get_mut(&s.cns[&cn1].uuid.clone())
        .unwrap()
        .work_state = WorkState::Draining;
    let obs = s.observe();
    let activity = obs.cn_activity["cn-1"].as_ref().unwrap();
    assert_eq!(activity.locks, Some(1));
    assert_eq!(activity.live_lock_holders, Some(0));
}

#[test]
fn expired_cn_loses_its_draining_mark() {
    let yaml = format!("{BASE}events:\n  - at: 10s\n    hakeeper_outage: {{duration: 40s}}\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    let uuid = s.cns[&pod(&s, "cn-1")].uuid.clone();
    s.apply_action(&mo_core::Action::SetCnWorkState {
        uuid: uuid.clone(),
        state: WorkState::Draining,
    })
    .unwrap();
    run_to(&mut s, secs(30));
    assert_eq!(s.hakeeper.cns[&uuid].work_state, WorkState::Draining);
    run_to(&mut s, secs(45));
    assert!(
        !s.hakeeper.cns.contains_key(&uuid),
        "expired after 30 s without heartbeats"
    );
    run_to(&mut s, secs(52));
    assert_eq!(s.hakeeper.cns[&uuid].work_state, WorkState::Working);
}

#[test]
fn a_cn_restarted_before_its_record_expires_keeps_its_up_time() {
    // `CNState.Update` sets UpTime only when the record is created: HAKeeper cannot tell a
    // quickly restarted CN from its old instance (seen on v1.2.4, `facts` step 4).
    let yaml = format!("{BASE}events:\n  - at: 10s\n    cn_crash: {{pod: cn-1}}\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    let p = pod(&s, "cn-1");
    let uuid = s.cns[&p].uuid.clone();
    let before = (s.cns[&p].epoch, s.hakeeper.cns[&uuid].epoch);
    assert_eq!(before.0, before.1);
    run_to(&mut s, secs(40));
    let p = pod(&s, "cn-1");
    assert_ne!(s.cns[&p].epoch, before.0, "a new process runs");
    assert_eq!(s.cns[&p].phase, CnPhase::Running);
    let record = &s.hakeeper.cns[&uuid];
    assert_eq!(
        record.heard_from, s.cns[&p].epoch,
        "the new instance heartbeats"
    );
    assert_eq!(
        record.epoch, before.1,
        "the record still reports the old UpTime"
    );
    let reported = s
        .observe()
        .hakeeper
        .expect("readable")
        .cns
        .into_iter()
        .find(|c| c.uuid == uuid)
        .expect("listed");
    assert_eq!(reported.start_epoch, before.1);
}

#[test]
fn update_on_unknown_cn_says_does_not_exist() {
    let mut s = sim(BASE);
    let err = s
        .apply_action(&mo_core::Action::SetCnWorkState {
            uuid: "nope".into(),
            state: WorkState::Draining,
        })
        .unwrap_err();
    assert_eq!(
        err,
        mo_core::ActionError::DoesNotExist("CN [nope] does not exist".into())
    );
    // DeleteCNStore of an unknown CN is a no-op.
    assert!(
        s.apply_action(&mo_core::Action::DeleteCnStore {
            uuid: "nope".into()
        })
        .is_ok()
    );
}

#[test]
fn proxy_moves_sessions_off_a_draining_cn_between_transactions() {
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    assert!(!s.cns[&cn1].sessions.is_empty());
    let uuid = s.cns[&cn1].uuid.clone();
    s.apply_action(&mo_core::Action::SetCnWorkState {
        uuid,
        state: WorkState::Draining,
    })
    .unwrap();
    run_to(&mut s, secs(10) + Millis(1_999));
    assert!(
        !s.cns[&cn1].sessions.is_empty(),
        "moves only after refresh + rebalance"
    );
    run_to(&mut s, secs(25));
    assert!(s.cns[&cn1].sessions.is_empty());
    assert_eq!(failures(&s), 0);
}

#[test]
fn a_session_always_in_a_transaction_moves_when_one_ends() {
    // Statements of 2 s and no think time to speak of: the session is almost never idle when
    // the proxy looks, so it moves on its transfer intent, as a transaction ends.
    let yaml = BASE
        .replace("clients: 4, txn_rate: 10", "clients: 2, txn_rate: 1000")
        .replace("tables: [a, b]}", "tables: [a, b], statement_latency: 2s}");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn1 = pod(&s, "cn-1");
    assert!(!s.cns[&cn1].sessions.is_empty());
    let uuid = s.cns[&cn1].uuid.clone();
    s.apply_action(&mo_core::Action::SetCnWorkState {
        uuid,
        state: WorkState::Draining,
    })
    .unwrap();
    // Refresh (5 s) + rebalance (3 s) + one transaction of up to 3 statements of 2 s.
    run_to(&mut s, secs(10 + 5 + 3 + 7));
    assert!(s.cns[&cn1].sessions.is_empty());
    assert_eq!(failures(&s), 0);
}

#[test]
fn pdb_refuses_eviction_with_429_and_the_evictor_retries() {
    let yaml = format!(
        "{BASE}pdbs: [{{component: cn, max_unavailable: 0}}]\nevents:\n  - at: 10s\n    evict: {{pod: cn-1, source: kubectl-drain}}\n"
    );
    let mut s = sim(&yaml);
    run_to(&mut s, secs(60));
    let refusals = s
        .event_log()
        .iter()
        .filter(|l| l.contains("eviction of cn-1") && l.contains("429"))
        .count();
    assert!(refusals >= 10, "retried every 5 s: {refusals}");
    assert!(s.pods[pod(&s, "cn-1")].deletion.is_none());
}

#[test]
fn legacy_allows_every_eviction_and_the_observer_counts_it() {
    let yaml =
        format!("{BASE}events:\n  - at: 10s\n    evict: {{pod: cn-1, source: kubectl-drain}}\n");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(60));
    assert_eq!(s.unsafe_actions.pod_deleted_without_drain_confirmation, 1);
    // The StatefulSet recreates the pod (new UID, same name and CN UUID).
    let p = pod(&s, "cn-1");
    assert_eq!(s.cns[&p].phase, CnPhase::Running);
}

#[test]
fn stopping_an_idle_cn_the_allocator_never_heard_of_is_not_unsafe() {
    // No client ever locked through cn-1: the running allocator has no entry for it, so nothing
    // depends on it; once it owns a lock table (a GetBind registered it), the same stop is unsafe.
    let idle = BASE.replace("clients: 4", "clients: 0, background: null");
    let evict = "events:\n  - at: 10s\n    evict: {pod: cn-1, source: kubectl-drain}\n";
    let mut s = sim(&format!("{idle}{evict}"));
    run_to(&mut s, secs(60));
    assert_eq!(s.unsafe_actions.pod_deleted_without_drain_confirmation, 0);

    let owner = format!("{idle}lock_tables: [{{table: a, owner: cn-1}}]\n{evict}");
    let mut s = sim(&owner);
    run_to(&mut s, secs(60));
    assert_eq!(s.unsafe_actions.pod_deleted_without_drain_confirmation, 1);
}

#[test]
fn node_failure_reschedules_pods_after_the_eviction_timeout() {
    let yaml = format!("{BASE}events:\n  - at: 10s\n    node_failure: {{node: node-6}}\n");
    let mut s = sim(&yaml);
    let before = s.pods[pod(&s, "cn-1")].node;
    assert_eq!(s.nodes[before].name, "node-6");
    run_to(&mut s, secs(300));
    assert!(
        !s.pods[pod(&s, "cn-1")].process_alive,
        "still on the dead node"
    );
    run_to(&mut s, secs(330));
    let p = pod(&s, "cn-1");
    assert_ne!(s.pods[p].node, before);
    assert_eq!(s.cns[&p].phase, CnPhase::Running);
    assert_eq!(
        s.unsafe_actions.total(),
        0,
        "involuntary: not an operator action"
    );
}

#[test]
fn consolidation_agent_retries_refused_evictions() {
    let yaml = "
name: agent
duration: 3m
topology:
  version: v1
  cn_groups:
    - {name: cn, replicas: 2}
    - {name: pool, pool: true, replicas: 1}
pdbs: [{component: cn, max_unavailable: 0}]
consolidation: {start: 30s, retry: 10s}
";
    let mut s = sim(yaml);
    run_to(&mut s, secs(180));
    let refusals = s
        .event_log()
        .iter()
        .filter(|l| l.contains("eviction of pool-0 by consolidation-agent: 429"))
        .count();
    assert!(refusals >= 10, "{refusals}");
}

#[test]
fn restarted_cn_with_the_fault_never_registers() {
    let yaml = format!(
        "{BASE}events:\n  - at: 1s\n    fault: {{cn_never_heartbeats_after_restart: true}}\n  - at: 10s\n    delete_pod: {{pod: cn-1}}\n"
    );
    let mut s = sim(&yaml);
    run_to(&mut s, secs(120));
    let p = pod(&s, "cn-1");
    assert_eq!(s.cns[&p].phase, CnPhase::Running);
    assert!(s.pods[p].ready, "answers SQL: Ready");
    let uuid = s.cns[&p].uuid.clone();
    assert!(
        !s.hakeeper.cns.contains_key(&uuid),
        "never heartbeats, so expired and gone"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever faults hit the cluster, each transaction is told exactly one outcome, and a
    /// client is told "committed" only for a transaction that really committed.
    #[test]
    fn every_transaction_gets_one_outcome_and_committed_means_committed(
        seed in 0u64..1_000,
        faults in proptest::collection::vec((0u64..240, 0usize..6), 0..5),
    ) {
        let mut events = String::from("events:\n");
        for (at, kind) in &faults {
            let event = match kind {
                0 => "cn_crash: {pod: cn-0}".to_string(),
                1 => "cn_crash: {pod: cn-1}".to_string(),
                2 => "node_failure: {node: node-2}".to_string(),
                3 => "delete_pod: {pod: log-0}".to_string(),
                4 => "hakeeper_outage: {duration: 20s}".to_string(),
                _ => "delete_pod: {pod: tn-0}".to_string(),
            };
            events.push_str(&format!("  - at: {at}s\n    {event}\n"));
        }
        let yaml = format!("{}seed: {seed}\n{}", BASE.replace("duration: 20m", "duration: 5m"),
            if faults.is_empty() { String::new() } else { events });
        let mut s = sim(&yaml);
        let report = s.run(&mut |_| {});
        let audit = s.audit().unwrap();
        let mut seen = BTreeSet::new();
        for (x, _) in &audit.outcomes {
            prop_assert!(seen.insert(*x), "txn {x} told two outcomes");
        }
        let truth: BTreeSet<u64> = audit.truth_committed.iter().copied().collect();
        for (x, kind) in &audit.outcomes {
            if *kind == OutcomeKind::Committed {
                prop_assert!(truth.contains(x), "txn {x} told committed but did not commit");
            }
        }
        let t = &report.txns;
        prop_assert_eq!(t.committed + t.failed_definite + t.unknown, audit.outcomes.len() as u64);
    }

    /// A shard commits exactly when it has a leader and a caught-up majority.
    #[test]
    fn shard_commit_rule(states in proptest::collection::vec(0u8..3, 1..7), leader in proptest::option::of(0usize..7)) {
        let replicas: Vec<Replica> = states.iter().enumerate().map(|(i, st)| Replica {
            store: format!("log-{i}"),
            state: match st { 0 => ReplicaState::Down, 1 => ReplicaState::Joined { caught_up: false }, _ => ReplicaState::Joined { caught_up: true } },
            epoch: 1,
            catch_up_generation: 0,
        }).collect();
        let leader = leader.filter(|l| *l < replicas.len());
        let shard = Shard { id: 1, replicas, leader, term: 1, election_scheduled: false };
        let caught_up = states.iter().filter(|s| **s == 2).count();
        prop_assert_eq!(shard.can_commit(), leader.is_some() && caught_up > states.len() / 2);
    }
}

#[test]
fn released_claim_drains_the_pooled_cn_to_idle_without_failures() {
    let yaml = "
name: pool
duration: 2m
topology:
  version: v1
  cn_groups:
    - {name: tenant, replicas: 1}
    - {name: pool, pool: true, replicas: 1, bound: 1}
workload: {clients: 6, txn_rate: 8, tables: [a]}
events:
  - {at: 30s, claim_release: {pod: pool-0}}
";
    let mut s = sim(yaml);
    run_to(&mut s, secs(29));
    let p = pod(&s, "pool-0");
    assert!(
        !s.cns[&p].sessions.is_empty(),
        "a Bound pooled CN serves the workload"
    );
    run_to(&mut s, secs(30) + Millis(500));
    assert_eq!(s.pods[p].pool_phase, Some(PoolPhase::Draining));
    run_to(&mut s, secs(60));
    assert_eq!(s.pods[p].pool_phase, Some(PoolPhase::Idle));
    assert!(s.cns[&p].sessions.is_empty());
    assert_eq!(failures(&s), 0);
}

#[test]
fn a_tn_restart_empties_the_lock_allocator_and_loses_what_crosses_it_to_the_restart() {
    let mut s = sim(BASE);
    run_to(&mut s, secs(20));
    assert!(!s.tn.allocator.binds.is_empty(), "the workload holds binds");
    let committed = s.counts.committed;
    let tn = pod(&s, "tn-0");
    let restart = mo_core::Action::RestartPod {
        pod: "tn-0".into(),
        uid: s.pods[tn].uid.clone(),
        version: "v2".into(),
    };
    s.apply_action(&restart).expect("restart accepted");
    run_to(&mut s, secs(90));
    assert_eq!(s.tn.phase, TnPhase::Running, "the new TN runs");
    assert!(s.counts.committed > committed, "the workload commits again");
    // Commits sent while it was down fail at once (no retry in the CN), and locks held across
    // the restart are gone with the old allocator: both the restart's, none the policy's fault.
    assert!(
        s.errors_by_kind
            .get("TN unavailable: connection refused")
            .is_some_and(|n| *n > 0)
    );
    assert!(s.failures_tn_restart > 0);
    assert_eq!(s.failures_tn_restart, failures(&s));
    assert_eq!(s.failures_voluntary, 0);
    assert_eq!(s.unsafe_actions.total(), 0, "{:?}", s.unsafe_log);
    // The new allocator knew nothing: every bind now was granted after the restart.
    assert!(
        s.tn.allocator
            .binds
            .values()
            .all(|b| b.version > s.tn.binds_lost_up_to)
    );
    // A second restart to the same version is not one an upgrade needs.
    let tn = pod(&s, "tn-0");
    let again = mo_core::Action::RestartPod {
        pod: "tn-0".into(),
        uid: s.pods[tn].uid.clone(),
        version: "v2".into(),
    };
    s.apply_action(&again).expect("restart accepted");
    assert_eq!(
        s.unsafe_actions.tn_stopped_without_need, 1,
        "{:?}",
        s.unsafe_log
    );
}

#[test]
fn a_commit_waiting_on_a_wal_blocked_by_a_log_fault_is_the_faults() {
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    crash(&mut s, "log-1");
    crash(&mut s, "log-2");
    // The client's COMMIT timeout is 60 s.
    run_to(&mut s, secs(100));
    assert!(
        failures(&s) > 0,
        "commits time out while the WAL is blocked"
    );
    assert_eq!(s.failures_voluntary, 0);
    assert_eq!(s.failures_tn_restart, 0);
    assert_eq!(s.failures_involuntary, failures(&s));
}

const TWO_PROXIES: &str = "
name: proxies
duration: 20m
topology:
  version: v1
  proxy_replicas: 2
  cn_groups: [{name: cn, replicas: 2}]
";

fn clients_on(s: &Simulation, proxy: PodId) -> usize {
    s.clients
        .iter()
        .filter(|c| c.proxy == Some(proxy) && c.session.is_some())
        .count()
}

#[test]
fn a_stopping_proxy_closes_every_connection_at_once_cutting_the_transactions_on_them() {
    // Statements of 2 s and no think time to speak of: every connection is inside a
    // transaction when the proxy gets its SIGTERM (v1.2.4 `Server.Close` disconnects them all).
    let yaml = format!(
        "{TWO_PROXIES}workload: {{clients: 6, txn_rate: 1000, tables: [a, b], statement_latency: 2s}}\n"
    );
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let p0 = pod(&s, "proxy-0");
    let busy = s
        .clients
        .iter()
        .filter(|c| c.proxy == Some(p0) && c.txn.is_some())
        .count() as u64;
    assert!(busy > 0);
    let uid = s.pods[p0].uid.clone();
    s.apply_action(&mo_core::Action::DeletePod {
        pod: "proxy-0".into(),
        uid,
        reason: "test".into(),
    })
    .unwrap();
    // Well before any of those transactions could have ended (each runs ≥ 2 s).
    let sigterm = secs(10) + s.t.kubelet_stop_delay.millis();
    run_to(&mut s, sigterm + Millis(100));
    assert_eq!(clients_on(&s, p0), 0);
    let cut = s
        .errors_by_kind
        .get("connection closed by proxy (no COMMIT sent)")
        .copied()
        .unwrap_or(0);
    assert_eq!(cut, busy, "{:?}", s.errors_by_kind);
    assert_eq!(s.failures_voluntary, busy);
}

#[test]
fn clients_leave_a_proxy_out_of_its_service_within_their_connection_lifetime() {
    let yaml = format!(
        "{TWO_PROXIES}workload: {{clients: 6, txn_rate: 10, tables: [a, b], connection_lifetime: 10s}}\n"
    );
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let p0 = pod(&s, "proxy-0");
    assert!(clients_on(&s, p0) > 0);
    let uid = s.pods[p0].uid.clone();
    s.apply_action(&mo_core::Action::SetProxyServing {
        pod: "proxy-0".into(),
        uid,
        serving: false,
    })
    .unwrap();
    let counted = |s: &Simulation| s.observe().proxy_connections["proxy-0"].clone();
    assert_eq!(counted(&s), Ok(clients_on(&s, p0) as u32));
    // A lifetime, plus the end of the transaction each is in.
    run_to(&mut s, secs(21));
    assert_eq!(clients_on(&s, p0), 0);
    assert_eq!(counted(&s), Ok(0));
    assert_eq!(failures(&s), 0);
    // Without a lifetime, clients keep their connections for good.
    let yaml = format!(
        "{TWO_PROXIES}workload: {{clients: 6, txn_rate: 10, tables: [a, b], connection_lifetime: null}}\n"
    );
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let p0 = pod(&s, "proxy-0");
    let before = clients_on(&s, p0);
    let uid = s.pods[p0].uid.clone();
    s.apply_action(&mo_core::Action::SetProxyServing {
        pod: "proxy-0".into(),
        uid,
        serving: false,
    })
    .unwrap();
    run_to(&mut s, secs(120));
    assert_eq!(clients_on(&s, p0), before);
}

#[test]
fn an_unlock_on_a_lost_owner_delays_commit_until_the_bind_moves_and_commit_succeeds() {
    // v1.2.4: `doWrite` defers the unlock inside COMMIT; `remoteLockTable.unlock` retries
    // until the allocator shows the bind changed, and only logs the failure.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("tables: [a, b]", "tables: [a]");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(10));
    let cn0 = pod(&s, "cn-0");
    let owner = Instance {
        pod: pod(&s, "cn-1"),
        epoch: s.pods[pod(&s, "cn-1")].epoch,
    };
    let version = s.tn.allocator.binds["a"].version;
    crash(&mut s, "cn-1");
    let moves = s.bind_invalidation_at(s.now);
    // A transaction on cn-0 that locked `a` on cn-1 and reached the TN: it commits there.
    let c = (0..s.clients.len())
        .find(|&c| s.clients[c].txn.is_none())
        .expect("an idle client");
    let x = 900_100;
    s.txns.insert(
        x,
        Txn {
            client: c,
            cn: Instance {
                pod: cn0,
                epoch: s.pods[cn0].epoch,
            },
            created_at: Millis::ZERO,
            tables: vec![0],
            next_stmt: 1,
            stage: TxnStage::Committing,
            locks: vec![HeldLock {
                table: 0,
                owner,
                version,
            }],
            tn_wait_deadline: None,
            commit_sent_at: s.now,
            timeout_armed: false,
            reported: false,
        },
    );
    s.clients[c].txn = Some(x);
    s.tn.wal_waiting.push(x);
    s.wal_done(x);
    assert_eq!(
        s.txns[&x].stage,
        TxnStage::Unlocking,
        "COMMIT has not returned"
    );
    let told = |s: &Simulation| {
        s.audit()
            .unwrap()
            .outcomes
            .iter()
            .find(|(t, _)| *t == x)
            .map(|(_, k)| *k)
    };
    run_to(&mut s, moves - Millis(1));
    assert_eq!(told(&s), None, "still unlocking until the bind moves");
    assert_eq!(s.clients[c].txn, Some(x));
    run_to(&mut s, moves + Millis(200));
    assert_eq!(told(&s), Some(OutcomeKind::Committed));
    assert!(
        !s.errors_by_kind.keys().any(|k| k.contains("unlock")),
        "{:?}",
        s.errors_by_kind
    );
}

#[test]
fn a_marked_owner_still_admits_an_older_transaction_on_a_table_it_references() {
    // v1.2.4 `service.go` `canLockOnServiceStatus`: a transaction whose snapshot is not newer
    // than the restart time may lock a table an active transaction references.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("clients: 4", "clients: 0, background: null");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    let (cn0, cn1) = (pod(&s, "cn-0"), pod(&s, "cn-1"));
    let on_cn0 = Instance {
        pod: cn0,
        epoch: s.cns[&cn0].epoch,
    };
    let txn = |created_at| Txn {
        reported: true,
        ..Txn::new(0, on_cn0, created_at, vec![0])
    };
    holding_lock(&mut s, "cn-0", 1, 0);
    let uuid = s.cns[&cn1].uuid.clone();
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(7));
    assert_eq!(s.cns[&cn1].restart_mode, RestartMode::Waiting);
    let learnt = s.cns[&cn1]
        .restart_time
        .expect("the CN learnt of the restart");
    s.txns.insert(2, txn(learnt - Millis(500)));
    s.txns.insert(3, txn(learnt + Millis(1)));
    assert!(
        matches!(s.acquire_lock(2, 0), LockResult::Granted(_)),
        "its snapshot predates the restart, and `a` is referenced"
    );
    assert!(matches!(s.acquire_lock(3, 0), LockResult::Retry));
}

#[test]
fn hakeeper_shows_a_stopped_log_store_until_its_record_goes_stale_and_catch_up_is_asked_of_the_replica()
 {
    let yaml = BASE.replace("clients: 4", "clients: 0, background: null")
        + "timings: {log_rejoin: 20s, log_catch_up: 40s}\n";
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    let replica = |s: &Simulation| {
        let d = s.observe().hakeeper.unwrap();
        let r = d.log_shards[1]
            .replicas
            .iter()
            .find(|r| r.store == "log-2")
            .unwrap()
            .clone();
        (r.up, r.caught_up)
    };
    assert_eq!(replica(&s), (true, true));
    crash(&mut s, "log-2");
    run_to(&mut s, secs(5) + Millis(500));
    assert_eq!(
        replica(&s),
        (true, false),
        "HAKeeper still shows it (its last heartbeat is fresh); a read through it fails"
    );
    run_to(&mut s, secs(9));
    assert!(!replica(&s).0, "a record three heartbeats old is not up");
    let p = pod(&s, "log-2");
    s.start_process(p);
    let restarted = s.now;
    run_to(&mut s, restarted + secs(21));
    assert_eq!(
        replica(&s),
        (true, false),
        "rejoined and following, but a read through it waits: not caught up"
    );
    run_to(&mut s, restarted + secs(62));
    assert_eq!(replica(&s), (true, true));
}

#[test]
fn a_proxy_routes_for_the_operator_as_long_as_it_heartbeats() {
    // The operator sees a proxy only through HAKeeper: its heartbeat (every 3 s) and the
    // Working CNs HAKeeper lists, never the proxy's own cached list.
    let mut s = sim(BASE);
    run_to(&mut s, secs(10));
    let routes = |s: &Simulation| s.observe().proxy_routes["proxy-0"].clone();
    assert_eq!(routes(&s), Ok(2));
    crash(&mut s, "proxy-0");
    run_to(&mut s, secs(12));
    assert_eq!(routes(&s), Ok(2), "its record is still fresh");
    run_to(&mut s, secs(20));
    assert!(routes(&s).is_err(), "{:?}", routes(&s));
}

#[test]
fn every_cn_runs_the_kernels_own_transactions_so_an_idle_cn_owns_lock_tables() {
    let yaml = BASE.replace("clients: 4", "clients: 0");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(120));
    for name in ["cn-0", "cn-1"] {
        let uuid = s.cns[&pod(&s, name)].uuid.clone();
        assert!(
            allocator_knows(&s, &uuid),
            "{name} locked through the allocator"
        );
    }
    assert!(
        s.tn.allocator
            .binds
            .keys()
            .any(|t| t.starts_with("mo_catalog") || t.starts_with("system")),
        "internal tables are bound: {:?}",
        s.tn.allocator.binds.keys().collect::<Vec<_>>()
    );
    assert!(s.background_counts.committed > 0);
    assert_eq!(s.counts.committed, 0, "not counted as the clients'");
    // Told to restart, an idle CN refuses its own background writes for good (20635).
    let cn1 = pod(&s, "cn-1");
    let uuid = s.cns[&cn1].uuid.clone();
    let before = s.background_counts.failed_definite;
    s.set_restart_service(&uuid).unwrap();
    run_to(&mut s, secs(240));
    assert!(s.background_counts.failed_definite > before);
    assert_eq!(failures(&s), 0, "no client transaction");
}

#[test]
fn hakeepers_clock_stands_still_while_its_shard_cannot_commit() {
    // Records age in HAKeeper's replicated ticks, which do not advance without a quorum: a CN
    // heard just before the outage is not expired after it.
    let yaml = BASE.replace("clients: 4", "clients: 0, background: null");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(5));
    crash(&mut s, "log-1");
    crash(&mut s, "log-2");
    run_to(&mut s, secs(95));
    for name in ["log-1", "log-2"] {
        let p = pod(&s, name);
        s.start_process(p);
    }
    run_to(&mut s, secs(200));
    assert!(s.hakeeper_available());
    let cn = s.observe().hakeeper.unwrap().cns;
    assert_eq!(cn.len(), 2, "no CN expired across the outage: {cn:?}");
    assert!(
        !s.event_log().iter().any(|l| l.contains("expired")),
        "{:?}",
        s.event_log()
            .iter()
            .filter(|l| l.contains("expired"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn stopping_a_cn_on_a_wedged_hand_over_is_judged_by_whether_a_live_transaction_depends_on_it() {
    // The checker judges a CN stop from the allocator and the transactions: a marked CN whose
    // counted transactions all ended (a leak) may stop; one a live transaction holds may not.
    let yaml = format!("{BASE}lock_tables: [{{table: a, owner: cn-1}}]\n")
        .replace("clients: 4", "clients: 0, background: null");
    for live in [false, true] {
        let mut s = sim(&yaml);
        run_to(&mut s, secs(5));
        let cn1 = pod(&s, "cn-1");
        let x = 900_600;
        holding_lock(&mut s, "cn-0", x, 0);
        // The owner never hears the unlock (as after a TN restart).
        s.cns.get_mut(&cn1).unwrap().holders.remove(&x);
        let requester = s.txns[&x].cn;
        s.cns
            .get_mut(&cn1)
            .unwrap()
            .stale_holders
            .insert(x, requester);
        if !live {
            s.txns.remove(&x);
        }
        let uuid = s.cns[&cn1].uuid.clone();
        s.set_restart_service(&uuid).unwrap();
        run_to(&mut s, secs(20));
        assert_eq!(s.cns[&cn1].restart_mode, RestartMode::Waiting, "wedged");
        s.delete_pod(cn1, Cause::Voluntary, false, "scale-in");
        // Judged when the process is told to stop (its SIGTERM, 900 ms later).
        let deleted = s.now;
        run_to(&mut s, deleted + secs(2));
        assert_eq!(
            s.unsafe_actions.pod_deleted_without_drain_confirmation,
            u64::from(live),
            "live holder: {live}; {:?}",
            s.unsafe_log
        );
    }
}

#[test]
fn a_cn_re_registers_with_its_configured_initial_work_state() {
    // `[cn] init-work-state = "draining"` (what the safe operator renders): a record re-created
    // after an expiry comes back Draining, so the proxies do not route to the CN until the
    // operator puts it into service.
    let yaml = format!("{BASE}events:\n  - at: 10s\n    hakeeper_outage: {{duration: 40s}}\n");
    let mut s = sim(&yaml);
    s.cn_init_work_state = WorkState::Draining;
    run_to(&mut s, secs(5));
    let uuid = s.cns[&pod(&s, "cn-1")].uuid.clone();
    assert_eq!(s.hakeeper.cns[&uuid].work_state, WorkState::Working);
    run_to(&mut s, secs(45));
    assert!(!s.hakeeper.cns.contains_key(&uuid), "expired");
    run_to(&mut s, secs(52));
    assert_eq!(s.hakeeper.cns[&uuid].work_state, WorkState::Draining);
}

#[test]
fn a_cn_the_catalog_left_behind_goes_forward_and_the_upgrade_completes() {
    // v3.0.15 -> v4.0.0-rc2 under the safe policy. Once a CN runs v4.0.0-rc2 (the catalog
    // moved to 4.0.0), an old CN that crashes can never start in place again: the operator
    // moves it onto the target, undrained (nothing of it runs), and the upgrade completes.
    let yaml = "
name: left-behind
duration: 40m
policy: safe
topology:
  version: v3.0.15
  cn_groups: [{name: cn, replicas: 3}]
workload: {clients: 4, txn_rate: 10, tables: [a, b]}
events:
  - at: 20s
    upgrade: {version: v4.0.0-rc2}
";
    let mut s = sim(yaml);
    let mut t = secs(20);
    while s.catalog_reached != Some((4, 0, 0)) {
        t += secs(1);
        run_to(&mut s, t);
        assert!(t < secs(1800), "no CN ran the target");
    }
    let old = s
        .live_pods()
        .filter(|&p| s.pods[p].component == Component::Cn && s.pods[p].version == "v3.0.15")
        .find(|&p| s.pods[p].ready)
        .expect("a CN still on v3.0.15, serving");
    let name = s.pods[old].name.clone();
    s.crash_process(old, Cause::Involuntary, true);
    run_to(&mut s, secs(2400));
    assert!(
        s.mechanisms
            .contains_key("CN of an older catalog stopped at start"),
        "{name} crash-looped on v3.0.15 first"
    );
    assert!(s.tracker.finished_at.is_some(), "the upgrade completes");
    assert!(
        s.live_pods()
            .all(|p| s.pods[p].component != Component::Cn || s.pods[p].version == "v4.0.0-rc2")
    );
    assert_eq!(s.unsafe_actions.total(), 0, "{:?}", s.unsafe_log);
    assert!(
        s.event_log()
            .iter()
            .any(|l| l.contains("MovedPastTheCatalog") && l.contains(&name)),
        "the operator said why"
    );
}

#[test]
fn a_cn_of_an_older_catalog_stops_at_start_and_a_newer_one_moves_the_catalog() {
    let yaml = BASE.replace("version: v1", "version: v4.0.0-rc2");
    let mut s = sim(&yaml);
    run_to(&mut s, secs(30));
    assert_eq!(
        s.catalog_reached,
        Some((4, 0, 0)),
        "the CNs' release brings 4.0.0"
    );
    let restart = |s: &mut Simulation, name: &str, version: &str| {
        let p = pod(s, name);
        let action = mo_core::Action::RestartPod {
            pod: name.into(),
            uid: s.pods[p].uid.clone(),
            version: version.into(),
        };
        s.apply_action(&action).expect("restart accepted");
    };
    // Back to v3.0.15 (catalog 3.0.3): the kernel stops it at start, again and again.
    restart(&mut s, "cn-0", "v3.0.15");
    run_to(&mut s, secs(150));
    let p = pod(&s, "cn-0");
    assert_eq!(s.pods[p].version, "v3.0.15");
    assert_ne!(s.cns[&p].phase, CnPhase::Running);
    assert!(s.pods[p].restarts >= 1, "it crash-loops");
    assert_eq!(s.unsafe_actions.cn_sent_back_past_its_catalog, 1);
    assert!(
        s.mechanisms
            .contains_key("CN of an older catalog stopped at start")
    );
    // On to v4.2.0 (catalog 4.0.6): it runs and moves the catalog.
    restart(&mut s, "cn-1", "v4.2.0");
    run_to(&mut s, secs(200));
    let p = pod(&s, "cn-1");
    assert_eq!(s.cns[&p].phase, CnPhase::Running);
    assert_eq!(s.catalog_reached, Some((4, 0, 6)));
}
