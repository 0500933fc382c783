//! MatrixOne components as the operator manages them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A MatrixOne role. `dn` is the older name of `tn` and is accepted everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    Log,
    #[serde(alias = "dn")]
    Tn,
    Cn,
    Proxy,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Log,
        Component::Tn,
        Component::Cn,
        Component::Proxy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Component::Log => "log",
            Component::Tn => "tn",
            Component::Cn => "cn",
            Component::Proxy => "proxy",
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown component `{0}` (expected one of: log, tn (or dn), cn, proxy)")]
pub struct UnknownComponent(pub String);

impl FromStr for Component {
    type Err = UnknownComponent;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "log" => Ok(Component::Log),
            "tn" | "dn" => Ok(Component::Tn),
            "cn" => Ok(Component::Cn),
            "proxy" => Ok(Component::Proxy),
            _ => Err(UnknownComponent(s.to_string())),
        }
    }
}

/// The store UUID a pod of `component` runs under: the operator renders it into the pod's
/// configuration and its kernel adapter finds the pod of a HAKeeper record by it (one function
/// for both). LOG, TN and proxy pods come from StatefulSets (`<cluster>-<role>-<ordinal>`):
/// their UUID is the ordinal behind a per-role digit, which the pod's start script computes
/// the same way (`printf '00000000-0000-0000-0000-%s%011x' <digit> <ordinal>`). CN pods are
/// created by the operator, which gives each its UUID ([`cn_uuid`]). `None`: not a pod name
/// this operator creates.
pub fn store_uuid(component: Component, pod_name: &str) -> Option<String> {
    let digit = match component {
        Component::Cn => return Some(cn_uuid(pod_name)),
        Component::Log => 0,
        Component::Tn => 1,
        Component::Proxy => 2,
    };
    let ordinal: u64 = pod_name.rsplit_once('-')?.1.parse().ok()?;
    Some(format!("00000000-0000-0000-0000-{digit}{ordinal:011x}"))
}

/// The digit [`store_uuid`] puts before a StatefulSet pod's ordinal (what the start script
/// needs to compute the same UUID).
pub fn store_uuid_digit(component: Component) -> Option<u8> {
    match component {
        Component::Log => Some(0),
        Component::Tn => Some(1),
        Component::Proxy => Some(2),
        Component::Cn => None,
    }
}

/// The CN UUID derives from the pod's DNS name, so it is stable across restarts of the pod.
pub fn cn_uuid(pod_name: &str) -> String {
    // FNV-1a over the name, printed as a UUID: deterministic and readable in logs.
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in pod_name.bytes() {
        h ^= b as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    let hex = format!("{h:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dn_and_tn_are_one_component() {
        assert_eq!("dn".parse::<Component>().unwrap(), Component::Tn);
        assert_eq!("TN".parse::<Component>().unwrap(), Component::Tn);
        let from_yaml: Component = serde_json::from_str("\"dn\"").unwrap();
        assert_eq!(from_yaml, Component::Tn);
    }

    #[test]
    fn store_uuids_are_per_role_and_ordinal() {
        assert_eq!(
            store_uuid(Component::Log, "mo-log-2").as_deref(),
            Some("00000000-0000-0000-0000-000000000002")
        );
        assert_eq!(
            store_uuid(Component::Tn, "mo-tn-0").as_deref(),
            Some("00000000-0000-0000-0000-100000000000")
        );
        assert_eq!(
            store_uuid(Component::Proxy, "a-b-proxy-17").as_deref(),
            Some("00000000-0000-0000-0000-200000000011")
        );
        assert_eq!(
            store_uuid(Component::Cn, "mo-tp-0"),
            Some(cn_uuid("mo-tp-0"))
        );
        assert_eq!(store_uuid(Component::Log, "log"), None);
        assert_ne!(
            store_uuid(Component::Log, "mo-log-1"),
            store_uuid(Component::Tn, "mo-tn-1")
        );
    }

    #[test]
    fn unknown_component_is_named_in_the_error() {
        let err = "cnx".parse::<Component>().unwrap_err();
        assert!(err.to_string().contains("`cnx`"));
    }
}
