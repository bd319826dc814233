//! Byte sizes and durations in the forms people write them.
//!
//! Both deserialize from either a number (bytes, seconds) or a string with a unit
//! (`"512M"`, `"1.5G"`, `"30s"`, `"5m"`), and serialize back to a number so that
//! API responses are easy to consume by programs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Errors from parsing a size or a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("invalid size {0:?}: expected a number of bytes or a number with a unit K, M, G or T (e.g. 512M)")]
    Size(String),
    #[error(
        "invalid duration {0:?}: expected seconds or a number with a unit ms, s, m or h (e.g. 30s)"
    )]
    Duration(String),
}

/// A number of bytes. `K`, `M`, `G`, `T` are binary multiples (KiB, MiB, ...), as in
/// `docker run --memory` and `ulimit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const KIB: u64 = 1024;
    pub const MIB: u64 = 1024 * 1024;
    pub const GIB: u64 = 1024 * 1024 * 1024;

    pub const fn mib(n: u64) -> Self {
        ByteSize(n * Self::MIB)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || UnitError::Size(s.to_string());
        let t = s.trim();
        if t.is_empty() {
            return Err(err());
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(err()),
        };
        if num.is_empty() {
            return Err(err());
        }
        if let Ok(n) = num.parse::<u64>() {
            return n.checked_mul(mult).map(ByteSize).ok_or_else(err);
        }
        let f: f64 = num.parse().map_err(|_| err())?;
        let v = f * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(err());
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, m) in [
            ("T", 1u64 << 40),
            ("G", 1 << 30),
            ("M", 1 << 20),
            ("K", 1 << 10),
        ] {
            if b >= m && b.is_multiple_of(m) {
                return write!(f, "{}{}", b / m, unit);
            }
        }
        write!(f, "{b}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A duration with a human form. Serialized as (possibly fractional) seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seconds(pub Duration);

impl Seconds {
    pub const fn secs(n: u64) -> Self {
        Seconds(Duration::from_secs(n))
    }
    pub const fn duration(self) -> Duration {
        self.0
    }
}

impl FromStr for Seconds {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || UnitError::Duration(s.to_string());
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(err());
        }
        let f: f64 = num.parse().map_err(|_| err())?;
        let mult = match unit.trim() {
            "" | "s" | "sec" | "secs" => 1.0,
            "ms" => 0.001,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        let v = f * mult;
        if !v.is_finite() || !(0.0..=1e12).contains(&v) {
            return Err(err());
        }
        Ok(Seconds(Duration::from_secs_f64(v)))
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{}s", d.as_secs())
        } else {
            write!(f, "{}ms", d.as_millis())
        }
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            s.serialize_u64(d.as_secs())
        } else {
            s.serialize_f64(d.as_secs_f64())
        }
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            F(f64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Seconds::secs(n)),
            Raw::F(f) if f.is_finite() && (0.0..1e12).contains(&f) => {
                Ok(Seconds(Duration::from_secs_f64(f)))
            }
            Raw::F(f) => Err(serde::de::Error::custom(format!("invalid duration {f}"))),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!("512M".parse::<ByteSize>().unwrap(), ByteSize(512 << 20));
        assert_eq!("1g".parse::<ByteSize>().unwrap(), ByteSize(1 << 30));
        assert_eq!("1.5K".parse::<ByteSize>().unwrap(), ByteSize(1536));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("2 GiB".parse::<ByteSize>().unwrap(), ByteSize(2 << 30));
        for bad in ["", "M", "12Q", "-1", "1.2.3G", "99999999999T"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad} should be refused");
        }
        assert_eq!(ByteSize(512 << 20).to_string(), "512M");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!("30s".parse::<Seconds>().unwrap(), Seconds::secs(30));
        assert_eq!("5m".parse::<Seconds>().unwrap(), Seconds::secs(300));
        assert_eq!(
            "250ms".parse::<Seconds>().unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!("7".parse::<Seconds>().unwrap(), Seconds::secs(7));
        for bad in ["", "s", "3 weeks", "-5s"] {
            assert!(bad.parse::<Seconds>().is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn serde_accepts_numbers_and_strings() {
        let s: ByteSize = serde_json::from_str("\"1M\"").unwrap();
        assert_eq!(s, ByteSize::mib(1));
        let s: ByteSize = serde_json::from_str("10").unwrap();
        assert_eq!(s, ByteSize(10));
        let d: Seconds = serde_json::from_str("1.5").unwrap();
        assert_eq!(d.0, Duration::from_millis(1500));
        assert_eq!(serde_json::to_string(&Seconds::secs(3)).unwrap(), "3");
        assert!(serde_json::from_str::<ByteSize>("\"lots\"").is_err());
    }
}
