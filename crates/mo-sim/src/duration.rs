//! Human durations in scenario files: `250ms`, `10s`, `5m`, `1h`, or a bare number of seconds.
//! Parsing and formatting live in the core ([`mo_core::time`]).

use mo_core::Millis;
use mo_core::time::{format_duration, parse_duration};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Millis);

impl Dur {
    pub const fn ms(ms: u64) -> Self {
        Dur(Millis(ms))
    }
    pub const fn secs(s: u64) -> Self {
        Dur(Millis::from_secs(s))
    }
    pub const fn mins(m: u64) -> Self {
        Dur(Millis::from_mins(m))
    }
    pub fn millis(self) -> Millis {
        self.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        mo_core::time::human::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        mo_core::time::human::deserialize(d).map(Dur)
    }
}

impl std::str::FromStr for Dur {
    type Err = mo_core::time::BadDuration;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Dur)
    }
}
