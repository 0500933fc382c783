//! Virtual time. The core never reads a clock: "now" is always an input.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// Milliseconds since the start of a run (simulated or real).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    pub const fn from_secs(secs: u64) -> Self {
        Millis(secs * 1000)
    }

    pub const fn from_mins(mins: u64) -> Self {
        Millis(mins * 60_000)
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// `self - earlier`, or zero when `earlier` is later (never panics on clock skew).
    pub fn since(self, earlier: Millis) -> Millis {
        Millis(self.0.saturating_sub(earlier.0))
    }
}

impl Add for Millis {
    type Output = Millis;
    fn add(self, rhs: Millis) -> Millis {
        Millis(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Millis {
    fn add_assign(&mut self, rhs: Millis) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Sub for Millis {
    type Output = Millis;
    fn sub(self, rhs: Millis) -> Millis {
        self.since(rhs)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtraction_saturates_instead_of_wrapping() {
        assert_eq!(Millis(5) - Millis(9), Millis::ZERO);
        assert_eq!(Millis::from_secs(3).since(Millis(500)), Millis(2500));
    }

    #[test]
    fn display_shows_seconds_with_millis() {
        assert_eq!(Millis(61_017).to_string(), "61.017s");
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration `{0}` (use e.g. 250ms, 10s, 5m, 1h)")]
pub struct BadDuration(pub String);

/// Parses `250ms`, `10s`, `1.5s`, `5m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Millis, BadDuration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| BadDuration(text.into()))?;
    let scale = match unit.trim() {
        "ms" => 1.0,
        "" | "s" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(BadDuration(text.into())),
    };
    let ms = value * scale;
    if !(0.0..=1e15).contains(&ms) {
        return Err(BadDuration(text.into()));
    }
    Ok(Millis(ms.round() as u64))
}

/// Formats as the shortest of `5m`, `10s`, `250ms`.
pub fn format_duration(d: Millis) -> String {
    let ms = d.0;
    if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `#[serde(with = "mo_core::time::human")]`: durations as `30s` text (numbers are seconds).
pub mod human {
    use super::{Millis, format_duration, parse_duration};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Millis, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Millis, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) if n.is_finite() && n >= 0.0 => Ok(Millis((n * 1000.0).round() as u64)),
            Raw::Num(n) => Err(serde::de::Error::custom(format!("invalid duration {n}"))),
            Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn parses_and_formats_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Millis::from_mins(5));
        assert_eq!(parse_duration("1h").unwrap(), Millis::from_mins(60));
        assert_eq!(parse_duration("7").unwrap(), Millis::from_secs(7));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        for d in [
            Millis(250),
            Millis(10_000),
            Millis::from_mins(5),
            Millis(61_500),
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
