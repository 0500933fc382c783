//! Who may ask the operator to let a CN stop: only the pod itself. Its preStop hook sends a
//! ServiceAccount token the kubelet projected into the pod for [`AUDIENCE`] alone (useless
//! against the API server), and the operator asks the API server (`TokenReview`) whose it is:
//! the review names the pod and its UID, which must be the ones the request speaks for.
//!
//! Pods made by an operator from before this check carry no token; they are let through on
//! their UID alone (as before) until a rollout or a restart replaces them.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The audience of the token a CN pod's hook sends: the API server refuses it as a credential.
pub const AUDIENCE: &str = "mo-operator.ops.matrixorigin.io/drain-hook";
/// Where the token is projected in the CN container, and the environment variable naming it.
pub const TOKEN_DIR: &str = "/var/run/secrets/mo-operator";
pub const TOKEN_FILE: &str = "token";
pub const ENV_TOKEN_FILE: &str = "MO_OPERATOR_TOKEN_FILE";
/// The projected volume carrying the token.
pub const TOKEN_VOLUME: &str = "mo-operator-token";
/// How long a reviewed token is trusted before it is reviewed again.
const REMEMBERED: Duration = Duration::from_secs(60);

const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// The pod a hook request speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

/// Reviewed tokens (by a digest of the token) and the pod each was bound to.
#[derive(Default)]
pub struct HookAuth {
    reviewed: Mutex<BTreeMap<u64, (Claim, Instant)>>,
}

fn digest(token: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    token.hash(&mut hasher);
    hasher.finish()
}

/// Whether the pod was made to carry a token (pods of older operators were not).
pub fn carries_token(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == TOKEN_VOLUME))
}

impl HookAuth {
    /// Ok when `token` is a token the API server issued to the pod instance `claim` names, for
    /// our audience; otherwise why not. Unknown (the API server unreachable) is a refusal too.
    pub async fn verify(
        &self,
        client: &Client,
        token: Option<&str>,
        claim: &Claim,
    ) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &claim.namespace);
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            // Only a pod that was never given a token may speak without one.
            return match pods.get_opt(&claim.pod).await {
                Ok(Some(pod))
                    if pod.metadata.uid.as_deref() == Some(claim.uid.as_str())
                        && !carries_token(&pod) =>
                {
                    Ok(())
                }
                Ok(_) => Err("no token: a hook request must carry its pod's token".into()),
                Err(e) => Err(format!("cannot read pod {} ({e}): retry", claim.pod)),
            };
        };
        let key = digest(token);
        {
            let mut reviewed = self.reviewed.lock().expect("reviewed lock");
            reviewed.retain(|_, (_, at)| at.elapsed() < REMEMBERED);
            if let Some((bound, _)) = reviewed.get(&key) {
                return check_claim(bound, claim);
            }
        }
        let bound = review(client, token).await?;
        check_claim(&bound, claim)?;
        self.reviewed
            .lock()
            .expect("reviewed lock")
            .insert(key, (bound, Instant::now()));
        Ok(())
    }
}

fn check_claim(bound: &Claim, claim: &Claim) -> Result<(), String> {
    if bound == claim {
        Ok(())
    } else {
        Err(format!(
            "the token is pod {}/{}'s ({}), not {}/{}'s ({})",
            bound.namespace, bound.pod, bound.uid, claim.namespace, claim.pod, claim.uid
        ))
    }
}

/// The pod the API server says `token` was issued to, for our audience.
async fn review(client: &Client, token: &str) -> Result<Claim, String> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: Some(vec![AUDIENCE.to_string()]),
        },
        ..TokenReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &request)
        .await
        .map_err(|e| format!("cannot review the token ({e}): retry"))?;
    let status = answer.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(format!(
            "the token is not valid: {}",
            status.error.unwrap_or_else(|| "not authenticated".into())
        ));
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == AUDIENCE))
    {
        return Err("the token is not for this operator (audience)".into());
    }
    let user = status.user.unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let namespace = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .map(|(ns, _)| ns.to_string())
        .ok_or_else(|| format!("the token is {username}'s, not a ServiceAccount's"))?;
    let extra = user.extra.unwrap_or_default();
    let one = |key: &str| -> Result<String, String> {
        match extra.get(key).map(Vec::as_slice) {
            Some([value]) => Ok(value.clone()),
            _ => Err(format!("the token is bound to no pod ({key})")),
        }
    };
    Ok(Claim {
        namespace,
        pod: one(EXTRA_POD_NAME)?,
        uid: one(EXTRA_POD_UID)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_speaks_only_for_the_instance_it_was_bound_to() {
        let bound = Claim {
            namespace: "db".into(),
            pod: "mo-tp-0".into(),
            uid: "u-1".into(),
        };
        assert!(check_claim(&bound, &bound.clone()).is_ok());
        for other in [
            Claim {
                uid: "u-2".into(),
                ..bound.clone()
            },
            Claim {
                pod: "mo-tp-1".into(),
                ..bound.clone()
            },
            Claim {
                namespace: "other".into(),
                ..bound.clone()
            },
        ] {
            assert!(check_claim(&bound, &other).is_err(), "{other:?}");
        }
    }
}
