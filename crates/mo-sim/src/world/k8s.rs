//! Kubernetes: nodes, pod lifecycle (Pending → Running → Ready; preStop, SIGTERM, SIGKILL after
//! the grace period), workload controllers that recreate pods, CrashLoopBackOff, the Eviction API
//! with PodDisruptionBudgets, and node failure.

use super::*;
use mo_core::{EvictionRequest, EvictionVerdict};

impl Simulation {
    pub(crate) fn create_pod(&mut self, name: &str, component: Component, node: usize) -> PodId {
        self.uid_counter += 1;
        let id = self.pods.len();
        let version = self
            .cn_template
            .as_ref()
            .filter(|_| component == Component::Cn)
            .or_else(|| self.template_version.get(name))
            .cloned()
            .unwrap_or_else(|| self.scenario.topology.version.clone());
        self.pods.push(Pod {
            name: name.to_string(),
            uid: format!("uid-{:06}", self.uid_counter),
            component,
            node,
            version,
            status: PodStatus::Pending,
            ready: false,
            process_alive: false,
            epoch: 0,
            sigterm_sent: false,
            deletion: None,
            restarts: 0,
            backoff: self.t.crash_backoff_initial.millis(),
            last_start: self.now,
            cn_group: None,
            pool_phase: None,
            cn_uuid: (component == Component::Cn).then(|| cn_uuid(name)),
            grace_override: None,
            serving: true,
        });
        self.pod_by_name.insert(name.to_string(), id);
        id
    }

    /// Starts pulling `version` onto `node` unless it is there or on its way.
    pub(crate) fn pull_image(&mut self, node: usize, version: &str) -> Millis {
        if self.node_images[node].contains(version) {
            return self.now;
        }
        let key = (node, version.to_string());
        if let Some(&at) = self.pulls.get(&key) {
            return at;
        }
        let at = self.now + self.t.image_pull.millis();
        self.pulls.insert(key, at);
        let index = match self.versions.iter().position(|v| v == version) {
            Some(i) => i,
            None => {
                self.versions.push(version.to_string());
                self.versions.len() - 1
            }
        };
        self.schedule(at, Ev::ImagePulled(node, index));
        at
    }

    /// Time until a new pod of `version` runs on `node`: the pull (if any), then the start.
    pub(crate) fn start_delay(&mut self, node: usize, version: &str) -> Millis {
        let ready_at = self.pull_image(node, version);
        (ready_at - self.now) + self.t.container_start.millis()
    }

    pub(crate) fn live_pods(&self) -> impl Iterator<Item = PodId> + '_ {
        (0..self.pods.len()).filter(|&p| self.pods[p].status != PodStatus::Gone)
    }

    pub(crate) fn pods_on_node(&self, node: usize) -> Vec<String> {
        self.live_pods()
            .filter(|&p| self.pods[p].node == node)
            .map(|p| self.pods[p].name.clone())
            .collect()
    }

    fn schedulable(&self, node: usize) -> bool {
        let n = &self.nodes[node];
        n.alive && !n.cordoned
    }

    /// Same node when possible (local volumes), else the least loaded schedulable node.
    pub(crate) fn choose_node(&self, preferred: usize) -> Option<usize> {
        if self.schedulable(preferred) {
            return Some(preferred);
        }
        (0..self.nodes.len())
            .filter(|&n| self.schedulable(n))
            .min_by_key(|&n| {
                (
                    self.live_pods().filter(|&p| self.pods[p].node == n).count(),
                    n,
                )
            })
    }

    pub(crate) fn pod_start(&mut self, p: PodId) {
        if self.pods[p].status != PodStatus::Pending || self.pods[p].deletion.is_some() {
            return;
        }
        if !self.nodes[self.pods[p].node].alive {
            match self.choose_node(self.pods[p].node) {
                Some(n) => self.pods[p].node = n,
                None => {
                    self.after(Dur::secs(5), Ev::PodStart(p));
                    return;
                }
            }
        }
        self.pods[p].status = PodStatus::Running;
        let name = self.pods[p].name.clone();
        let node = self.nodes[self.pods[p].node].name.clone();
        let version = self.pods[p].version.clone();
        self.trace(&name, "running", || {
            format!("running on {node} ({version})")
        });
        self.log("k8s", || format!("{name} running on {node} ({version})"));
        self.wake_operator();
        self.start_process(p);
    }

    pub(crate) fn start_process(&mut self, p: PodId) {
        let epoch = self.next_epoch();
        {
            let pod = &mut self.pods[p];
            pod.epoch = epoch;
            pod.process_alive = true;
            pod.sigterm_sent = false;
            pod.last_start = self.now;
            pod.ready = false;
        }
        match self.pods[p].component {
            Component::Log => self.log_store_started(p, epoch),
            Component::Tn => self.tn_process_started(p, epoch),
            Component::Cn => self.cn_process_started(p, epoch),
            Component::Proxy => self.proxy_process_started(p, epoch),
        }
    }

    /// Begins a graceful deletion. Voluntary deletions of MatrixOne processes are checked
    /// against the safety rules by the observer.
    pub(crate) fn delete_pod(&mut self, p: PodId, cause: Cause, recreate: bool, why: &str) {
        if self.pods[p].status == PodStatus::Gone || self.pods[p].deletion.is_some() {
            return;
        }
        if self.pods[p].component == Component::Tn {
            self.tn.stop_cause = cause;
        }
        // A CN runs on until its SIGTERM (and may yet take a lock table meanwhile): its stop is
        // judged then. The others are judged at their deletion.
        if cause == Cause::Voluntary
            && self.pods[p].process_alive
            && self.pods[p].component != Component::Cn
        {
            self.check_voluntary_stop(p, why);
        }
        self.pods[p].deletion = Some(Deletion {
            cause,
            recreate,
            why: why.to_string(),
        });
        self.set_ready(p, false);
        let name = self.pods[p].name.clone();
        self.trace(&name, "deleted", || why.to_string());
        self.log("k8s", || format!("{name} deleted ({why})"));
        if !self.pods[p].process_alive {
            self.pod_gone(p);
        } else {
            self.after(self.t.kubelet_stop_delay, Ev::PodSigterm(p));
        }
    }

    pub(crate) fn pod_sigterm(&mut self, p: PodId) {
        let pod = &self.pods[p];
        if pod.status == PodStatus::Gone || !pod.process_alive || pod.sigterm_sent {
            return;
        }
        let cause = pod.deletion.as_ref().map_or(Cause::Voluntary, |d| d.cause);
        let epoch = pod.epoch;
        self.pods[p].sigterm_sent = true;
        self.set_ready(p, false);
        let name = self.pods[p].name.clone();
        self.trace(&name, "sigterm", || "SIGTERM".into());
        self.log("kubelet", || format!("{name}: SIGTERM"));
        let grace = self.pods[p]
            .grace_override
            .unwrap_or_else(|| self.t.termination_grace.millis());
        self.schedule(self.now + grace, Ev::PodKill(p, epoch));
        match self.pods[p].component {
            Component::Log => {
                self.log_stop_cause.insert(name.clone(), cause);
                self.log_store_stopped(&name);
                self.after(self.t.log_shutdown, Ev::ProcessExit(p, epoch));
            }
            Component::Tn => {
                self.tn_begin_stop();
                self.after(self.t.tn_shutdown, Ev::ProcessExit(p, epoch));
            }
            Component::Cn => {
                if cause == Cause::Voluntary {
                    let why = self.pods[p]
                        .deletion
                        .as_ref()
                        .map_or_else(String::new, |d| d.why.clone());
                    self.check_voluntary_stop(p, &why);
                }
                self.cn_begin_shutdown(p, cause);
                self.after(self.t.cn_lock_close, Ev::CnLockClose(p, epoch));
                self.after(self.t.cn_shutdown, Ev::ProcessExit(p, epoch));
            }
            Component::Proxy => {
                self.proxy_begin_shutdown(p);
                self.maybe_proxy_exit(p);
            }
        }
    }

    pub(crate) fn pod_kill(&mut self, p: PodId, epoch: u64) {
        if self.pods[p].process_alive && self.pods[p].epoch == epoch {
            let name = self.pods[p].name.clone();
            self.log("kubelet", || format!("{name}: SIGKILL after grace period"));
            self.crash_process(p, Cause::Voluntary, false);
        }
    }

    /// Normal end of a process that was shutting down.
    pub(crate) fn process_exit(&mut self, p: PodId, epoch: u64) {
        if !self.pods[p].process_alive || self.pods[p].epoch != epoch {
            return;
        }
        self.process_stopped(p);
        self.after_process_end(p);
    }

    /// Immediate death (crash, SIGKILL, node failure): no shutdown sequence.
    pub(crate) fn crash_process(&mut self, p: PodId, cause: Cause, restart: bool) {
        if !self.pods[p].process_alive {
            return;
        }
        let name = self.pods[p].name.clone();
        self.trace(&name, "crash", || "process died".into());
        self.set_ready(p, false);
        match self.pods[p].component {
            Component::Log => {
                let name = self.pods[p].name.clone();
                self.log_stop_cause.insert(name.clone(), cause);
                self.log_store_stopped(&name);
            }
            Component::Tn => {
                // A deleted pod keeps the cause its deletion gave (a kill at the end of the
                // grace period is still that deletion).
                if self.pods[p].deletion.is_none() {
                    self.tn.stop_cause = cause;
                }
                self.tn_stop("TN connection lost: EOF");
            }
            Component::Cn => {
                self.orphan_remote_locks(p);
                self.cn_begin_shutdown(p, cause);
            }
            Component::Proxy => self.proxy_begin_shutdown(p),
        }
        self.process_stopped(p);
        if restart || self.pods[p].deletion.is_some() {
            self.after_process_end(p);
        }
    }

    fn process_stopped(&mut self, p: PodId) {
        self.pods[p].process_alive = false;
        self.set_ready(p, false);
        match self.pods[p].component {
            Component::Cn => self.cn_process_exited(p),
            Component::Proxy => self.proxy_process_exited(p),
            Component::Tn => {
                if self.tn.phase != TnPhase::Down {
                    self.tn_stop("TN connection lost: EOF");
                }
            }
            Component::Log => {}
        }
        self.update_route_state();
    }

    /// After the container ended: the pod goes away (deletion) or restarts (crash loop).
    fn after_process_end(&mut self, p: PodId) {
        if self.pods[p].deletion.is_some() {
            self.pod_gone(p);
            return;
        }
        if !self.nodes[self.pods[p].node].alive {
            return;
        }
        // CrashLoopBackOff; the delay resets after 10 minutes of running.
        let ran = self.now - self.pods[p].last_start;
        if ran >= Millis::from_mins(10) {
            self.pods[p].backoff = self.t.crash_backoff_initial.millis();
        }
        let delay = self.pods[p].backoff;
        self.pods[p].backoff = Millis((delay.0 * 2).min(self.t.crash_backoff_max.millis().0));
        let at = self.now + delay;
        self.schedule(at, Ev::ContainerRestart(p));
    }

    pub(crate) fn container_restart(&mut self, p: PodId) {
        let pod = &self.pods[p];
        if pod.status != PodStatus::Running || pod.deletion.is_some() || pod.process_alive {
            return;
        }
        if !self.nodes[pod.node].alive {
            return;
        }
        self.pods[p].restarts += 1;
        let name = self.pods[p].name.clone();
        let restarts = self.pods[p].restarts;
        self.trace(&name, "restart", || {
            format!("container restart #{restarts}")
        });
        self.log("kubelet", || {
            format!("{name}: container restart #{restarts}")
        });
        self.start_process(p);
    }

    pub(crate) fn pod_gone(&mut self, p: PodId) {
        let deletion = self.pods[p].deletion.clone();
        self.pods[p].status = PodStatus::Gone;
        self.set_ready(p, false);
        let name = self.pods[p].name.clone();
        if self.pod_by_name.get(&name) == Some(&p) {
            self.pod_by_name.remove(&name);
        }
        let removed = self.removals.iter().any(|r| r.pod == name);
        self.removals.retain(|r| r.pod != name);
        self.trace(&name, "gone", || "gone".into());
        self.log("k8s", || format!("{name} gone"));
        if removed {
            self.cns.remove(&p);
            return;
        }
        if deletion.is_some_and(|d| d.recreate) {
            let component = self.pods[p].component;
            let Some(node) = self.choose_node(self.pods[p].node) else {
                // Nowhere to run: the workload keeps it Pending on its old node until one frees.
                let id = self.create_pod(&name, component, self.pods[p].node);
                self.copy_membership(p, id);
                self.after(Dur::secs(5), Ev::PodStart(id));
                return;
            };
            let id = self.create_pod(&name, component, node);
            self.copy_membership(p, id);
            let version = self.pods[id].version.clone();
            let delay = self.start_delay(node, &version);
            self.schedule(self.now + delay, Ev::PodStart(id));
        }
    }

    pub(crate) fn copy_membership(&mut self, from: PodId, to: PodId) {
        self.pods[to].cn_group = self.pods[from].cn_group;
        self.pods[to].pool_phase = self.pods[from].pool_phase;
        if let Some(cn) = self.cns.remove(&from) {
            self.cns.insert(to, cn);
            // Sessions and holders belong to the old instance; it is gone.
            if let Some(cn) = self.cns.get_mut(&to) {
                cn.phase = CnPhase::Down;
                cn.lock_open = false;
            }
        }
        if let Some(proxy) = self.proxies.remove(&from) {
            self.proxies.insert(to, proxy);
        }
    }

    pub(crate) fn fail_node(&mut self, n: usize) {
        if !self.nodes[n].alive {
            return;
        }
        self.nodes[n].alive = false;
        let name = self.nodes[n].name.clone();
        self.log("fault", || format!("node {name} fails"));
        for pod in self.pods_on_node(n) {
            let p = self.pod_by_name[&pod];
            self.crash_process(p, Cause::Involuntary, false);
        }
        self.after(self.t.node_failure_eviction, Ev::NodeEvictPods(n));
    }

    pub(crate) fn node_evict_pods(&mut self, n: usize) {
        for pod in self.pods_on_node(n) {
            let p = self.pod_by_name[&pod];
            self.delete_pod(p, Cause::Involuntary, true, "node failed");
        }
    }

    pub(crate) fn request_eviction(
        &mut self,
        pod: String,
        source: String,
        give_up_at: Option<Millis>,
    ) {
        let retry = match (&self.scenario.consolidation, source.as_str()) {
            (Some(c), "consolidation-agent") => c.retry.millis(),
            _ => Millis::from_secs(5),
        };
        self.evictions.push(PendingEviction {
            pod,
            source,
            retry,
            give_up_at,
            done: false,
        });
        self.retry_eviction(self.evictions.len() - 1);
    }

    /// One call on the Eviction API: PDB first, then the validating webhook (the policy).
    pub(crate) fn retry_eviction(&mut self, i: usize) {
        if self.evictions[i].done {
            return;
        }
        let name = self.evictions[i].pod.clone();
        let source = self.evictions[i].source.clone();
        let Some(&p) = self.pod_by_name.get(&name) else {
            self.evictions[i].done = true;
            return;
        };
        if self.pods[p].deletion.is_some() {
            self.evictions[i].done = true;
            return;
        }
        if self.evictions[i].give_up_at.is_some_and(|t| self.now >= t) {
            self.evictions[i].done = true;
            self.log("k8s", || {
                format!("eviction of {name} by {source}: evictor gave up")
            });
            return;
        }
        if let Some(reason) = self.pdb_refusal(p) {
            self.log("k8s", || {
                format!("eviction of {name} by {source}: 429 ({reason})")
            });
            let retry = self.evictions[i].retry;
            self.schedule(self.now + retry, Ev::EvictionRetry(i));
            return;
        }
        let request = EvictionRequest {
            pod: name.clone(),
            uid: self.pods[p].uid.clone(),
            source: source.clone(),
        };
        let observation = self.observe();
        match self.policy.review_eviction(&observation, &request) {
            EvictionVerdict::Allow => {
                self.evictions[i].done = true;
                self.log("k8s", || format!("eviction of {name} by {source}: allowed"));
                self.delete_pod(p, Cause::Voluntary, true, "evicted");
            }
            EvictionVerdict::Deny { reason } => {
                self.log("k8s", || {
                    format!("eviction of {name} by {source}: 429 ({reason})")
                });
                let retry = self.evictions[i].retry;
                self.schedule(self.now + retry, Ev::EvictionRetry(i));
            }
        }
    }

    fn pdb_refusal(&self, p: PodId) -> Option<String> {
        let component = self.pods[p].component;
        let max_unavailable = *self.pdbs.get(&component)?;
        let pods: Vec<PodId> = self
            .live_pods()
            .filter(|&q| self.pods[q].component == component)
            .collect();
        let healthy = |q: PodId| self.pods[q].ready && self.pods[q].deletion.is_none();
        if !healthy(p) {
            return None;
        }
        let healthy_count = pods.iter().filter(|&&q| healthy(q)).count();
        let min_available = pods.len().saturating_sub(max_unavailable);
        (healthy_count <= min_available).then(|| {
            format!(
                "PodDisruptionBudget for {component}: {healthy_count} healthy, {min_available} required"
            )
        })
    }
}
