//! The status people read: conditions that say what is happening and what to do, the rollout
//! step and the gate it waits on, drains, and the persisted progress record.

use crate::crd::{
    ComponentStatus, DrainView, MatrixOneCluster, MatrixOneClusterStatus, RolloutStatusView,
};
use crate::observation::{cluster_pods, component_of, is_ready, running_version};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use mo_core::drain::{DrainPurpose, DrainStage};
use mo_core::rollout::{Rollout, RolloutStatus, Step};
use mo_core::{Component, Observation, Policy, SafePolicy};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const HALTED: &str = "Halted";
pub const DEGRADED: &str = "Degraded";
/// True while a CN is being drained; the message says what each drain waits on.
pub const DRAINING: &str = "Draining";

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    previous: &[Condition],
    generation: Option<i64>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The spec passed the schema but not the core: nothing is acted on until it is fixed.
pub fn invalid_spec(
    generation: Option<i64>,
    previous: &MatrixOneClusterStatus,
    message: &str,
) -> MatrixOneClusterStatus {
    let mut status = previous.clone();
    status.observed_generation = generation;
    let prev = &previous.conditions;
    let text = format!("{message}. Nothing is changed until the spec is fixed.");
    status.conditions = vec![
        condition(prev, generation, READY, false, "InvalidSpec", text.clone()),
        condition(
            prev,
            generation,
            PROGRESSING,
            false,
            "InvalidSpec",
            text.clone(),
        ),
        condition(prev, generation, HALTED, false, "NotHalted", String::new()),
        condition(prev, generation, DEGRADED, true, "InvalidSpec", text),
    ];
    status
}

fn describe_step(rollout: &Rollout) -> String {
    let phase = rollout
        .phases
        .get(rollout.phase)
        .map_or("-".to_string(), |c| c.to_string());
    match &rollout.status {
        RolloutStatus::Complete => "complete".into(),
        RolloutStatus::Halted { .. } => format!("halted in {phase} phase"),
        RolloutStatus::RolledBack { .. } => format!("rolled back in {phase} phase"),
        RolloutStatus::Running => {
            let what = rollout
                .steps()
                .map(|step| match step {
                    Step::NextPod => "next pod".to_string(),
                    Step::MoveLeadership { pod, .. } => format!("move leadership off {pod}"),
                    Step::DrainCn { pod, .. } => format!("drain {pod}"),
                    Step::DrainProxy { pod, .. } => format!("drain connections off {pod}"),
                    Step::Restart { pod, .. } => format!("restart {pod}"),
                    Step::Verify { pod, .. } => format!("verify {pod}"),
                    Step::Settle { .. } => "settle".to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            let verb = if rollout.rolling_back {
                "rollback"
            } else {
                "upgrade"
            };
            format!("{verb} {phase}: {what}")
        }
    }
}

fn stage_name(stage: DrainStage) -> &'static str {
    match stage {
        DrainStage::MarkDraining => "MarkDraining",
        DrainStage::MigrateSessions => "MigrateSessions",
        DrainStage::HandOver => "HandOver",
        DrainStage::Confirmed => "Confirmed",
        DrainStage::Released => "Released",
        DrainStage::Cancelling => "Cancelling",
        DrainStage::Finished => "Finished",
    }
}

fn purpose_name(purpose: &DrainPurpose) -> String {
    match purpose {
        DrainPurpose::Remove { why } => format!("remove ({why})"),
        DrainPurpose::Restart { version } => format!("restart on {version}"),
        DrainPurpose::Evict { source } => format!("eviction by {source}"),
        DrainPurpose::NodeFailure { node } => format!("node {node} failed"),
    }
}

pub fn build(
    cluster: &MatrixOneCluster,
    previous: &MatrixOneClusterStatus,
    observation: &Observation,
    policy: &SafePolicy,
    templates: &BTreeMap<String, String>,
    pods: &[Arc<Pod>],
    problems: &[String],
) -> MatrixOneClusterStatus {
    let generation = cluster.metadata.generation;
    let name = cluster.name_any();
    let desired = cluster.spec.desired_pods();
    let mut components = BTreeMap::new();
    for c in Component::ALL {
        let mine: Vec<&Pod> = cluster_pods(&name, pods)
            .filter(|p| component_of(p) == Some(c))
            .collect();
        let mut versions: BTreeMap<String, i32> = BTreeMap::new();
        for p in &mine {
            *versions.entry(running_version(p)).or_default() += 1;
        }
        components.insert(
            c.as_str().to_string(),
            ComponentStatus {
                replicas: desired.get(&c).map_or(0, |v| v.len() as i32),
                ready: mine.iter().filter(|p| is_ready(p)).count() as i32,
                versions,
            },
        );
    }
    let record = policy.record();
    let rollout = record.rollout.as_ref().map(|r| RolloutStatusView {
        target: r.target.clone(),
        step: describe_step(r),
        waiting_on: match &r.status {
            RolloutStatus::Halted { reason } | RolloutStatus::RolledBack { reason } => {
                Some(reason.clone())
            }
            RolloutStatus::Running => r.hold.clone(),
            RolloutStatus::Complete => None,
        },
    });
    let drains: Vec<DrainView> = record
        .drains
        .iter()
        .filter(|d| d.is_active())
        .map(|d| DrainView {
            pod: d.pod.clone(),
            pod_uid: d.pod_uid.clone(),
            cn_uuid: d.cn_uuid.clone(),
            purpose: purpose_name(&d.purpose),
            stage: stage_name(d.stage).into(),
            waiting_on: d.hold.clone(),
        })
        .collect();

    let prev = &previous.conditions;
    let pods_ready = components.values().all(|s| s.ready >= s.replicas);
    let kernel_error = observation.hakeeper.as_ref().err().map(|e| e.to_string());
    let halted = record.rollout.as_ref().and_then(|r| match &r.status {
        RolloutStatus::Halted { reason } => Some((r.target.clone(), reason.clone(), false)),
        RolloutStatus::RolledBack { reason } => Some((r.target.clone(), reason.clone(), true)),
        _ => None,
    });
    let upgrading = record
        .rollout
        .as_ref()
        .is_some_and(|r| r.status == RolloutStatus::Running);
    let removing = !observation.desired.removals.is_empty();
    let creation_slow = record
        .rollout
        .as_ref()
        .filter(|r| r.alarmed && r.status == RolloutStatus::Running)
        .map(|r| {
            format!(
                "creation of {} is past its stall timeout and keeps waiting: {}",
                r.target,
                r.hold.clone().unwrap_or_default()
            )
        });
    let drain_alarms: Vec<String> = record
        .drains
        .iter()
        .filter(|d| d.is_active() && d.alarmed)
        .map(|d| {
            format!(
                "drain of {} is long: {}",
                d.pod,
                d.hold.clone().unwrap_or_default()
            )
        })
        .collect();

    let ready = condition(
        prev,
        generation,
        READY,
        pods_ready && kernel_error.is_none() && !upgrading && halted.is_none() && !removing,
        if kernel_error.is_some() {
            "KernelUnreachable"
        } else if halted.is_some() {
            "RolloutHalted"
        } else if upgrading {
            "Upgrading"
        } else if removing {
            "ScalingIn"
        } else if !pods_ready {
            "PodsNotReady"
        } else {
            "AllComponentsReady"
        },
        if let Some(e) = &kernel_error {
            format!("cannot read the kernel ({e}); every pod stays protected until it answers")
        } else if !pods_ready {
            let missing: Vec<String> = components
                .iter()
                .filter(|(_, s)| s.ready < s.replicas)
                .map(|(c, s)| format!("{c} {}/{}", s.ready, s.replicas))
                .collect();
            format!("pods not ready: {}", missing.join(", "))
        } else {
            "every component runs and its gate holds".into()
        },
    );
    let progressing_message = if let Some(r) = &rollout
        && upgrading
    {
        format!(
            "{} to {}{}",
            r.step,
            r.target,
            r.waiting_on
                .as_ref()
                .map(|w| format!("; waiting on: {w}"))
                .unwrap_or_default()
        )
    } else if removing {
        let pods: Vec<String> = observation
            .desired
            .removals
            .iter()
            .map(|r| r.pod.clone())
            .collect();
        format!(
            "removing {} after each drain is confirmed for that exact instance",
            pods.join(", ")
        )
    } else {
        String::new()
    };
    let progressing = condition(
        prev,
        generation,
        PROGRESSING,
        upgrading || removing,
        if upgrading {
            "Upgrading"
        } else if removing {
            "ScalingIn"
        } else {
            "Stable"
        },
        progressing_message,
    );
    let halted_condition = match &halted {
        Some((target, reason, rolled_back)) => {
            let rollout = record.rollout.as_ref();
            let previous_version = rollout
                .and_then(|r| r.previous.values().find(|v| **v != r.target).cloned())
                .unwrap_or_default();
            // The kernel's catalog refuses the target, or the way back to the previous version.
            let refused = rollout.and_then(|r| r.cn_refusal(&r.target)).is_some();
            let no_way_back = rollout
                .and_then(|r| r.previous.get(&Component::Cn).and_then(|v| r.cn_refusal(v)))
                .is_some();
            let (code, message) = if refused {
                (
                    "VersionRefused",
                    format!(
                        "rollout to {target} halted: {reason}. Nothing was deleted or restarted. \
                         Set spec.version to the version the CNs run, or a newer one, to go on."
                    ),
                )
            } else {
                let advice = if previous_version.is_empty() || no_way_back {
                    "set spec.version to another version to start a new rollout".to_string()
                } else {
                    format!(
                        "set spec.version to {previous_version} to roll back or to a newer version to start a new rollout"
                    )
                };
                (
                    if *rolled_back {
                        "RolledBack"
                    } else {
                        "StallTimeout"
                    },
                    format!(
                        "rollout to {target} {}: {reason}. Nothing was deleted or restarted because of the timeout. Fix the cause, then {advice}.",
                        if *rolled_back {
                            "rolled back and stopped"
                        } else {
                            "halted"
                        },
                    ),
                )
            };
            condition(prev, generation, HALTED, true, code, message)
        }
        None => condition(prev, generation, HALTED, false, "NotHalted", String::new()),
    };
    // A configuration problem comes first: it is often why the kernel does not answer.
    let degraded_reasons: Vec<String> = problems
        .iter()
        .cloned()
        .chain(
            kernel_error
                .iter()
                .map(|e| format!("kernel unreachable: {e}")),
        )
        .chain(creation_slow.clone())
        .chain(drain_alarms)
        .collect();
    let degraded = condition(
        prev,
        generation,
        DEGRADED,
        !degraded_reasons.is_empty(),
        if !problems.is_empty() {
            "ConfigurationProblem"
        } else if kernel_error.is_some() {
            "KernelUnreachable"
        } else if creation_slow.is_some() {
            "CreationSlow"
        } else if !degraded_reasons.is_empty() {
            "DrainAlarm"
        } else {
            "Healthy"
        },
        degraded_reasons.join("; "),
    );
    let active: Vec<&mo_core::drain::Drain> =
        record.drains.iter().filter(|d| d.is_active()).collect();
    let draining = condition(
        prev,
        generation,
        DRAINING,
        !active.is_empty(),
        if active.is_empty() {
            "NoDrain"
        } else if active
            .iter()
            .any(|d| matches!(d.purpose, mo_core::drain::DrainPurpose::Evict { .. }))
        {
            "EvictionWaiting"
        } else {
            "OperatorDrain"
        },
        active
            .iter()
            .map(|d| {
                format!(
                    "{} ({}, {:?}): {}",
                    d.pod,
                    d.pod_uid,
                    d.stage,
                    d.hold.clone().unwrap_or_else(|| "in progress".into())
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    MatrixOneClusterStatus {
        observed_generation: generation,
        conditions: vec![ready, progressing, halted_condition, degraded, draining],
        components,
        template_versions: templates.clone(),
        rollout,
        drains,
        progress: policy.progress_record(),
        log_bootstrap: previous.log_bootstrap.clone(),
    }
}
