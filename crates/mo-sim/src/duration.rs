//! Human durations in scenario files: `250ms`, `10s`, `5m`, `1h`, or a bare number of seconds.

use mo_core::Millis;
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

#[derive(Debug, thiserror::Error)]
#[error("invalid duration `{0}` (use e.g. 250ms, 10s, 5m, 1h)")]
pub struct BadDuration(String);

pub fn parse_duration(text: &str) -> Result<Dur, BadDuration> {
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
    Ok(Dur(Millis(ms.round() as u64)))
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.0;
        if ms % 60_000 == 0 && ms > 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms % 1000 == 0 {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) if n.is_finite() && n >= 0.0 => {
                Ok(Dur(Millis((n * 1000.0).round() as u64)))
            }
            Raw::Num(n) => Err(serde::de::Error::custom(format!("invalid duration {n}"))),
            Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Dur::ms(250));
        assert_eq!(parse_duration("10s").unwrap(), Dur::secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Dur::ms(1500));
        assert_eq!(parse_duration("5m").unwrap(), Dur::mins(5));
        assert_eq!(parse_duration("1h").unwrap(), Dur::mins(60));
        assert_eq!(parse_duration("7").unwrap(), Dur::secs(7));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn display_round_trips() {
        for d in [Dur::ms(250), Dur::secs(10), Dur::mins(5), Dur::ms(61_500)] {
            assert_eq!(parse_duration(&d.to_string()).unwrap(), d);
        }
    }
}
