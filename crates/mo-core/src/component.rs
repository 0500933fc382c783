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
    fn unknown_component_is_named_in_the_error() {
        let err = "cnx".parse::<Component>().unwrap_err();
        assert!(err.to_string().contains("`cnx`"));
    }
}
