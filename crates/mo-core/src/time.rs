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
