//! The simulated data plane driven from outside: a real Kubernetes API server owns the pods,
//! this model runs the MatrixOne processes behind them.
//!
//! The caller (the fake kubelet) reports what the API server says — a pod bound to a node, a
//! deletion requested, an object gone — and reads back what the processes did (running, ready,
//! exited) and what the kernel answers on its admin API. Time is an input, as everywhere in the
//! simulator: the caller advances it (scaled wall-clock time).
//!
//! Unlike a scenario run, nothing is started at time 0: the cluster boots cold as its pods
//! arrive, and no policy runs inside — the operator under test is the policy.

use crate::scenario::Scenario;
use crate::world::{Cause, PodId, PodStatus, RunOptions, Simulation};
use mo_core::{
    Action, ActionError, ActionOutput, Component, Decision, EvictionRequest, EvictionVerdict,
    KernelView, Millis, Observation, Policy, PolicyInput,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The operator is outside: inside the simulation nothing decides.
struct NoPolicy;

impl Policy for NoPolicy {
    fn name(&self) -> &str {
        "external"
    }
    fn decide(&mut self, _: PolicyInput<'_>) -> Decision {
        Decision::default()
    }
    fn review_eviction(&mut self, _: &Observation, _: &EvictionRequest) -> EvictionVerdict {
        EvictionVerdict::Allow
    }
}

/// The state of one pod's container as a kubelet reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReport {
    pub name: String,
    /// The API server's UID of the pod object this process belongs to.
    pub uid: String,
    pub started: bool,
    pub running: bool,
    pub ready: bool,
    pub restarts: u32,
    pub version: String,
    /// The container ended after a deletion: the kubelet may remove the object.
    pub terminated: bool,
}

/// One MatrixOne cluster's processes, attached to pods that live elsewhere.
pub struct AttachedCluster {
    sim: Simulation,
    /// Pod name → (API UID, the simulated pod it runs as).
    attached: BTreeMap<String, (String, PodId)>,
    /// Pods whose previous incarnation is still shutting down: started once it is gone.
    waiting: BTreeMap<String, (String, String, String)>,
}

impl AttachedCluster {
    /// `scenario` gives the topology (pod names without the cluster prefix), timings, the
    /// workload and the seed; its events and policy are ignored.
    pub fn new(mut scenario: Scenario) -> AttachedCluster {
        scenario.events.clear();
        scenario.consolidation = None;
        // Lock tables given an owner bind to it when first used (nothing runs yet).
        let preset = std::mem::take(&mut scenario.lock_tables)
            .into_iter()
            .map(|lt| (lt.table, lt.owner))
            .collect();
        let mut sim = Simulation::build(scenario, Box::new(NoPolicy), RunOptions::default());
        // The operator attached is ours: it renders `init-work-state = "draining"`.
        sim.cn_init_work_state = mo_core::WorkState::Draining;
        sim.preset_owners = preset;
        sim.bootstrap_cold();
        AttachedCluster {
            sim,
            attached: BTreeMap::new(),
            waiting: BTreeMap::new(),
        }
    }

    pub fn now(&self) -> Millis {
        self.sim.now
    }

    /// Runs the processes up to `t` (earlier times are ignored).
    pub fn advance_to(&mut self, t: Millis) {
        if t > self.sim.now {
            self.sim.run_until(t, &mut |_| {});
        }
        self.start_waiting();
    }

    /// The node names the model knows, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.sim.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The API server says pod `name` (object `uid`) is bound to `node` with `version`.
    /// Unknown names of a known component join the cluster (a CN group scaled out).
    pub fn pod_bound(
        &mut self,
        name: &str,
        uid: &str,
        node: &str,
        version: &str,
    ) -> Result<(), AttachError> {
        if self.attached.get(name).is_some_and(|(u, _)| u == uid) {
            return Ok(());
        }
        let node_index = self
            .sim
            .nodes
            .iter()
            .position(|n| n.name == node)
            .ok_or_else(|| AttachError::UnknownNode(node.to_string()))?;
        let live = self
            .sim
            .pod_by_name
            .get(name)
            .copied()
            .filter(|&p| self.sim.pods[p].status != PodStatus::Gone);
        match live {
            // A pod of the initial topology that never ran: this object is its first.
            Some(p) if !self.attached.contains_key(name) && !self.sim.pods[p].process_alive => {
                self.attached.insert(name.to_string(), (uid.to_string(), p));
                let pod = &mut self.sim.pods[p];
                pod.uid = uid.to_string();
                pod.node = node_index;
                pod.version = version.to_string();
                let delay = self.sim.start_delay(node_index, version);
                let at = self.sim.now + delay;
                self.sim.schedule(at, crate::world::Ev::PodStart(p));
                Ok(())
            }
            // The previous incarnation is still shutting down: start after it.
            Some(_) => {
                self.waiting.insert(
                    name.to_string(),
                    (uid.to_string(), node.to_string(), version.to_string()),
                );
                Ok(())
            }
            None => {
                self.start_incarnation(name, uid, node_index, version)?;
                Ok(())
            }
        }
    }

    fn start_incarnation(
        &mut self,
        name: &str,
        uid: &str,
        node: usize,
        version: &str,
    ) -> Result<PodId, AttachError> {
        let previous = self.attached.get(name).map(|(_, p)| *p).or_else(|| {
            (0..self.sim.pods.len())
                .rev()
                .find(|&p| self.sim.pods[p].name == name)
        });
        let component = match previous {
            Some(p) => self.sim.pods[p].component,
            None => self.component_of_new(name)?,
        };
        let p = self.sim.create_pod(name, component, node);
        {
            let pod = &mut self.sim.pods[p];
            pod.uid = uid.to_string();
            pod.version = version.to_string();
        }
        match previous {
            Some(old) => self.sim.copy_membership(old, p),
            None => {
                let group = name.rsplit_once('-').map(|(stem, _)| stem);
                self.sim.pods[p].cn_group = self
                    .sim
                    .groups
                    .iter()
                    .position(|g| Some(g.name.as_str()) == group);
            }
        }
        self.attached.insert(name.to_string(), (uid.to_string(), p));
        let delay = self.sim.start_delay(node, version);
        let at = self.sim.now + delay;
        self.sim.schedule(at, crate::world::Ev::PodStart(p));
        Ok(p)
    }

    /// Only CN groups grow at run time; a new name must belong to one of them.
    fn component_of_new(&self, name: &str) -> Result<Component, AttachError> {
        let stem = name.rsplit_once('-').map(|(stem, _)| stem).unwrap_or(name);
        if self.sim.groups.iter().any(|g| g.name == stem) {
            Ok(Component::Cn)
        } else {
            Err(AttachError::UnknownPod(name.to_string()))
        }
    }

    fn start_waiting(&mut self) {
        let ready: Vec<String> = self
            .waiting
            .keys()
            .filter(|name| {
                self.sim
                    .pod_by_name
                    .get(*name)
                    .is_none_or(|&p| self.sim.pods[p].status == PodStatus::Gone)
            })
            .cloned()
            .collect();
        for name in ready {
            let (uid, node, version) = self.waiting.remove(&name).expect("listed above");
            if let Some(n) = self.sim.nodes.iter().position(|x| x.name == node) {
                // A name that cannot start again (unknown) is dropped: the kubelet reports it.
                let _ = self.start_incarnation(&name, &uid, n, &version);
            }
        }
    }

    /// A graceful deletion of pod object `uid` was requested (deletionTimestamp set) with
    /// `grace` (in model time) before SIGKILL; `None` keeps the model's default.
    pub fn pod_deleting(&mut self, name: &str, uid: &str, grace: Option<Millis>) {
        self.waiting.retain(|n, (u, _, _)| !(n == name && u == uid));
        let Some(&(ref attached_uid, p)) = self.attached.get(name) else {
            return;
        };
        if attached_uid != uid {
            return;
        }
        if self.sim.pods[p].deletion.is_none() {
            self.sim.pods[p].grace_override = grace;
            // The webhook refuses anyone else's delete of the only proxy: this is the
            // operator's restart.
            self.sim.mark_only_proxy_restart(p);
        }
        self.sim
            .delete_pod(p, Cause::Voluntary, false, crate::world::API_DELETE);
    }

    /// The proxy pod's Service label, as the API server has it: out of the SQL Service, no
    /// new connection reaches it.
    pub fn set_proxy_serving(&mut self, name: &str, uid: &str, serving: bool) {
        if let Some(&(ref attached_uid, p)) = self.attached.get(name)
            && attached_uid == uid
        {
            self.sim.pods[p].serving = serving;
        }
    }

    /// For each client session on CN `name`: the proxy it came through (model pod name).
    pub fn session_proxies(&self, name: &str) -> Vec<Option<String>> {
        let Some(&p) = self.sim.pod_by_name.get(name) else {
            return Vec::new();
        };
        let Some(cn) = self.sim.cns.get(&p) else {
            return Vec::new();
        };
        cn.sessions
            .iter()
            .map(|&c| {
                self.sim.clients[c]
                    .proxy
                    .map(|q| self.sim.pods[q].name.clone())
            })
            .collect()
    }

    /// The transactions CN `name`'s current process runs (its `GetTxnInfo`): id and when each
    /// began, in simulated time.
    pub fn cn_transactions(&self, name: &str) -> Vec<(u64, Millis)> {
        let Some(&p) = self.sim.pod_by_name.get(name) else {
            return Vec::new();
        };
        let Some(cn) = self.sim.cns.get(&p) else {
            return Vec::new();
        };
        self.sim
            .txns
            .iter()
            .filter(|(_, t)| t.cn.pod == p && t.cn.epoch == cn.epoch)
            .map(|(&x, t)| (x, t.created_at))
            .collect()
    }

    /// The transactions holding locks in CN `name`'s lock tables as its lock service lists
    /// them (`GetLockInfo`), the ones it never heard unlock included.
    pub fn cn_lock_holders(&self, name: &str) -> Vec<u64> {
        let Some(cn) = self
            .sim
            .pod_by_name
            .get(name)
            .and_then(|p| self.sim.cns.get(p))
        else {
            return Vec::new();
        };
        cn.holders
            .iter()
            .chain(cn.stale_holders.keys())
            .copied()
            .collect()
    }

    /// The object vanished without our kubelet finishing it (a force delete): the container
    /// is killed at once.
    pub fn pod_vanished(&mut self, name: &str, uid: &str) {
        self.pod_deleting(name, uid, Some(Millis::ZERO));
        if let Some(&(ref attached_uid, p)) = self.attached.get(name)
            && attached_uid == uid
        {
            self.sim.crash_process(p, Cause::Voluntary, false);
            if self.sim.pods[p].status != PodStatus::Gone {
                self.sim.pod_gone(p);
            }
            self.attached.remove(name);
        }
    }

    /// The kubelet ended pod object `uid` for good (an eviction under node pressure, a node
    /// shutdown): its container is killed and never started again. The object stays (phase
    /// `Failed`) until someone deletes it; its deletion then finishes at once.
    pub fn pod_failed(&mut self, name: &str, uid: &str) {
        self.waiting.retain(|n, (u, _, _)| !(n == name && u == uid));
        if let Some(&(ref attached_uid, p)) = self.attached.get(name)
            && attached_uid == uid
        {
            self.sim.crash_process(p, Cause::Involuntary, false);
        }
    }

    /// The kubelet removed a terminated pod's object: forget it.
    pub fn pod_removed(&mut self, name: &str, uid: &str) {
        if self.attached.get(name).is_some_and(|(u, _)| u == uid) {
            self.attached.remove(name);
        }
    }

    /// Every attached pod's container state.
    pub fn pod_reports(&self) -> Vec<PodReport> {
        self.attached
            .iter()
            .map(|(name, (uid, p))| {
                let pod = &self.sim.pods[*p];
                PodReport {
                    name: name.clone(),
                    uid: uid.clone(),
                    started: pod.status != PodStatus::Pending,
                    running: pod.process_alive,
                    ready: pod.ready && pod.status == PodStatus::Running,
                    restarts: pod.restarts,
                    version: pod.version.clone(),
                    terminated: pod.status == PodStatus::Gone,
                }
            })
            .collect()
    }

    /// What HAKeeper, the lock allocator, the CN query services and the proxies answer now.
    pub fn kernel_view(&self) -> KernelView {
        let o = self.sim.observe();
        KernelView {
            hakeeper: o.hakeeper,
            lock_allocator: o.lock_allocator,
            cn_activity: o.cn_activity,
            proxy_routes: o.proxy_routes,
            proxy_connections: o.proxy_connections,
            tn_wal_tolerance: o.tn_wal_tolerance,
        }
    }

    /// The kernel offers the run-time WAL tolerance call (an operator extension).
    pub fn offers_wal_tolerance(&self) -> bool {
        self.sim.wal_tolerance
    }

    /// Images present on each node.
    pub fn node_images(&self) -> BTreeMap<String, Vec<String>> {
        self.sim.observe().node_images
    }

    /// A call on the kernel's admin API. Pod actions belong to the API server, not here.
    pub fn admin_call(&mut self, action: &Action) -> Result<ActionOutput, ActionError> {
        match action {
            Action::DeletePod { .. }
            | Action::RestartPod { .. }
            | Action::SetProxyServing { .. } => Err(ActionError::Unsupported(
                "pods are deleted through the Kubernetes API".into(),
            )),
            other => self.sim.apply_action(other),
        }
    }

    /// Turns the "a restarted CN never heartbeats" fault on or off (incident 002).
    pub fn set_cn_never_heartbeats(&mut self, on: bool) {
        self.sim.fault_cn_never_heartbeats = on;
    }

    /// Turns the "the lock allocator never confirms a hand-over" fault on or off.
    pub fn set_handover_never_confirms(&mut self, on: bool) {
        self.sim.fault_handover_never_confirms = on;
    }

    /// Which CN (pod name) owns each bound lock table now.
    pub fn lock_table_owners(&self) -> BTreeMap<String, String> {
        self.sim
            .tn
            .allocator
            .binds
            .iter()
            .map(|(table, bind)| (table.clone(), self.sim.pods[bind.owner.pod].name.clone()))
            .collect()
    }

    /// Transaction outcomes, TN exits and the independent observer's verdicts so far.
    pub fn report(&mut self) -> crate::Report {
        self.sim.report()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("node {0} is not one of the simulated nodes")]
    UnknownNode(String),
    #[error("pod {0} belongs to no component of this cluster")]
    UnknownPod(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use mo_core::WorkState;

    fn scenario() -> Scenario {
        Scenario::from_yaml(
            "name: attached\nseed: 3\nduration: 1h\npolicy: safe\ntopology:\n  version: v1\n  nodes: 3\n  cn_groups:\n    - name: cn\n      replicas: 2\nworkload:\n  clients: 4\n  txn_rate: 5\n  tables: [t1, t2]\n",
        )
        .expect("valid scenario")
    }

    fn boot(cluster: &mut AttachedCluster) {
        let names = ["log-0", "log-1", "log-2", "tn-0", "cn-0", "cn-1", "proxy-0"];
        for (i, name) in names.iter().enumerate() {
            let node = format!("node-{}", i % 3 + 1);
            cluster
                .pod_bound(name, &format!("uid-{name}"), &node, "v1")
                .expect("known pod");
        }
    }

    /// What the operator does for every CN that registered (Draining, its `init-work-state`):
    /// puts it into service.
    fn into_service(cluster: &mut AttachedCluster, until: Millis) {
        let mut t = cluster.now();
        while t < until {
            t += Millis::from_secs(1);
            cluster.advance_to(t);
            let draining: Vec<String> = cluster
                .kernel_view()
                .hakeeper
                .map(|d| d.cns)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.work_state == WorkState::Draining)
                .map(|c| c.uuid)
                .collect();
            for uuid in draining {
                let _ = cluster.admin_call(&Action::SetCnWorkState {
                    uuid,
                    state: WorkState::Working,
                });
            }
        }
    }

    #[test]
    fn a_cold_cluster_boots_as_its_pods_arrive() {
        let mut cluster = AttachedCluster::new(scenario());
        assert!(cluster.pod_reports().is_empty());
        boot(&mut cluster);
        into_service(&mut cluster, Millis::from_mins(2));
        cluster.advance_to(Millis::from_mins(10));
        let reports = cluster.pod_reports();
        assert_eq!(reports.len(), 7);
        assert!(reports.iter().all(|r| r.ready), "{reports:?}");
        let view = cluster.kernel_view();
        let details = view.hakeeper.expect("HAKeeper answers");
        assert_eq!(details.cns.len(), 2);
        assert!(details.log_shards.iter().all(|s| s.leader.is_some()));
        let report = cluster.report();
        assert!(report.txns.committed > 0, "{report:?}");
        assert_eq!(report.txns.unknown, 0);
    }

    #[test]
    fn a_deleted_pod_terminates_and_a_new_object_starts_a_new_instance() {
        let mut cluster = AttachedCluster::new(scenario());
        boot(&mut cluster);
        cluster.advance_to(Millis::from_mins(10));
        let before = cluster.kernel_view().hakeeper.expect("up").cns;
        cluster.pod_deleting("proxy-0", "uid-proxy-0", None);
        cluster.advance_to(Millis::from_mins(12));
        let proxy = |c: &AttachedCluster| {
            c.pod_reports()
                .into_iter()
                .find(|r| r.name == "proxy-0")
                .expect("attached")
        };
        assert!(proxy(&cluster).terminated);
        cluster.pod_removed("proxy-0", "uid-proxy-0");
        cluster
            .pod_bound("proxy-0", "uid-proxy-0-b", "node-2", "v2")
            .expect("known");
        cluster.advance_to(Millis::from_mins(25));
        let again = proxy(&cluster);
        assert_eq!((again.uid.as_str(), again.ready), ("uid-proxy-0-b", true));
        assert_eq!(again.version, "v2");
        assert_eq!(
            cluster.kernel_view().hakeeper.expect("up").cns.len(),
            before.len()
        );
    }

    #[test]
    fn a_scaled_out_cn_registers_and_unknown_pods_are_refused() {
        let mut cluster = AttachedCluster::new(scenario());
        boot(&mut cluster);
        cluster.advance_to(Millis::from_mins(10));
        cluster
            .pod_bound("cn-2", "uid-cn-2", "node-1", "v1")
            .expect("a CN group grows");
        assert_eq!(
            cluster.pod_bound("log-7", "uid-x", "node-1", "v1"),
            Err(AttachError::UnknownPod("log-7".into()))
        );
        assert_eq!(
            cluster.pod_bound("cn-3", "uid-y", "node-9", "v1"),
            Err(AttachError::UnknownNode("node-9".into()))
        );
        cluster.advance_to(Millis::from_mins(15));
        let cns = cluster.kernel_view().hakeeper.expect("up").cns;
        assert_eq!(cns.len(), 3);
    }

    /// The incident-000 shape on a cold cluster: an idle pooled CN with no sessions owns the
    /// lock table the other CNs' DML uses.
    #[test]
    fn a_preset_lock_table_binds_to_its_idle_owner_on_first_use() {
        let scenario = Scenario::from_yaml(
            "name: attached\nseed: 3\nduration: 1h\npolicy: safe\ntopology:\n  version: v1\n  nodes: 3\n  cn_groups:\n    - name: cn\n      replicas: 2\n    - name: idle\n      replicas: 1\n      pool: true\n      bound: 0\nlock_tables:\n  - table: documents\n    owner: idle-0\nworkload:\n  clients: 4\n  txn_rate: 5\n  tables: [documents]\n",
        )
        .expect("valid scenario");
        let mut cluster = AttachedCluster::new(scenario);
        boot(&mut cluster);
        cluster
            .pod_bound("idle-0", "uid-idle-0", "node-3", "v1")
            .expect("known pod");
        into_service(&mut cluster, Millis::from_mins(2));
        cluster.advance_to(Millis::from_mins(10));
        assert_eq!(
            cluster
                .lock_table_owners()
                .get("documents")
                .map(String::as_str),
            Some("idle-0")
        );
        let view = cluster.kernel_view();
        let idle = view.cn_activity["idle-0"].as_ref().expect("answers");
        assert_eq!(idle.sessions, 0, "no client session on the owner");
        let report = cluster.report();
        assert!(report.txns.committed > 0, "{report:?}");
        assert_eq!((report.txns.unknown, report.txns.failed_definite), (0, 0));
    }
}
