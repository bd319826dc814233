//! Byte sizes and durations in the forms people write them.
//!
//! Both deserialize from either a number (bytes, seconds) or a string with a unit
//! (`"512M"`, `"1.5G"`, `"30s"`, `"5m"`), and serialize back to a number so that
//! API responses are easy to consume by programs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a size may be written, for error messages.
const SIZE_FORMS: &str =
    "use a number of bytes (0 or more) or a string like \"512M\" (units K, M, G, T)";

/// How a duration may be written, for error messages.
const DURATION_FORMS: &str =
    "use seconds (0 or more) or a string like \"30s\", \"5m\" (units ms, s, m, h)";

/// The longest duration accepted, in seconds.
const MAX_DURATION_SECS: f64 = 1e12;

/// Errors from parsing a size or a duration. Each holds the text that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a size at all (bad number, unknown unit, negative).
    #[error("{0:?} is not a size: {SIZE_FORMS}")]
    Size(String),
    /// A well-formed size past `u64::MAX` bytes.
    #[error("{0:?} is not a size: too large (at most {max} bytes)", max = u64::MAX)]
    SizeTooLarge(String),
    /// Not a duration at all (bad number, unknown unit, negative).
    #[error("{0:?} is not a duration: {DURATION_FORMS}")]
    Duration(String),
    /// A well-formed duration past the longest accepted.
    #[error("{0:?} is not a duration: too long (at most 1e12 seconds)")]
    DurationTooLong(String),
}

/// How a value of the wrong type is named in messages (`true is not a size`).
fn describe_wrong_type(unexpected: de::Unexpected<'_>) -> String {
    match unexpected {
        de::Unexpected::Bool(b) => b.to_string(),
        de::Unexpected::Unit | de::Unexpected::Option => "null".to_string(),
        de::Unexpected::Map => "an object".to_string(),
        de::Unexpected::Seq => "a list".to_string(),
        other => other.to_string(),
    }
}

/// The `Visitor` methods for values of the wrong type (`true`, `null`, objects, lists,
/// bytes that are not UTF-8), each refused with `Self::wrong_type`, which names what
/// was given; bytes that are UTF-8 are read as a string.
macro_rules! refuse_wrong_types {
    ($value:ty) => {
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<$value, E> {
            match std::str::from_utf8(v) {
                Ok(s) => self.visit_str(s),
                Err(_) => Err(Self::wrong_type(de::Unexpected::Bytes(v))),
            }
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<$value, E> {
            Err(Self::wrong_type(de::Unexpected::Bool(v)))
        }

        fn visit_unit<E: de::Error>(self) -> Result<$value, E> {
            Err(Self::wrong_type(de::Unexpected::Unit))
        }

        fn visit_none<E: de::Error>(self) -> Result<$value, E> {
            Err(Self::wrong_type(de::Unexpected::Option))
        }

        fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<$value, A::Error> {
            Err(Self::wrong_type(de::Unexpected::Map))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<$value, A::Error> {
            Err(Self::wrong_type(de::Unexpected::Seq))
        }
    };
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
        let too_large = || UnitError::SizeTooLarge(s.to_string());
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
            return n.checked_mul(mult).map(ByteSize).ok_or_else(too_large);
        }
        let f: f64 = num.parse().map_err(|_| err())?;
        let v = f * mult as f64;
        if v.is_nan() || v < 0.0 {
            return Err(err());
        }
        if v > u64::MAX as f64 {
            return Err(too_large());
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

/// Accepts a whole number of bytes (0 or more) or a string with a unit (`"512M"`).
/// Anything else, fractional numbers included, is refused with a message that says what
/// is wrong and what is accepted.
struct ByteSizeVisitor;

impl ByteSizeVisitor {
    fn wrong_type<E: de::Error>(unexpected: de::Unexpected<'_>) -> E {
        E::custom(format_args!(
            "{} is not a size: {SIZE_FORMS}",
            describe_wrong_type(unexpected)
        ))
    }
}

impl<'de> Visitor<'de> for ByteSizeVisitor {
    type Value = ByteSize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a size: a number of bytes (0 or more) or a string like \"512M\" (units K, M, G, T)"
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
        Ok(ByteSize(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
        u64::try_from(v)
            .map(ByteSize)
            .map_err(|_| E::custom(format_args!("{v} is not a size: {SIZE_FORMS}")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
        // `{:?}` keeps the decimal point (`1024.0`) and writes huge values as `1e30`.
        Err(if v < 0.0 {
            E::custom(format_args!("{v:?} is not a size: {SIZE_FORMS}"))
        } else if v >= u64::MAX as f64 {
            E::custom(format_args!(
                "{v:?} is not a size: too large (at most {} bytes)",
                u64::MAX
            ))
        } else {
            E::custom(format_args!(
                "{v:?} is not a size: use a whole number of bytes, without a decimal point or \
                 exponent, or a string like \"512M\" or \"1.5G\""
            ))
        })
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
        v.parse().map_err(E::custom)
    }

    refuse_wrong_types!(ByteSize);
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ByteSizeVisitor)
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
        if v > MAX_DURATION_SECS {
            return Err(UnitError::DurationTooLong(s.to_string()));
        }
        if !(0.0..=MAX_DURATION_SECS).contains(&v) {
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

/// Accepts seconds (a whole or fractional number, 0 or more) or a string with a unit
/// (`"30s"`, `"5m"`). Anything else is refused with a message that says what is wrong and
/// what is accepted.
struct SecondsVisitor;

impl SecondsVisitor {
    fn wrong_type<E: de::Error>(unexpected: de::Unexpected<'_>) -> E {
        E::custom(format_args!(
            "{} is not a duration: {DURATION_FORMS}",
            describe_wrong_type(unexpected)
        ))
    }
}

impl<'de> Visitor<'de> for SecondsVisitor {
    type Value = Seconds;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a duration: seconds (0 or more) or a string like \"30s\", \"5m\" (units ms, s, m, h)"
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
        Ok(Seconds::secs(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
        u64::try_from(v)
            .map(Seconds::secs)
            .map_err(|_| E::custom(format_args!("{v} is not a duration: {DURATION_FORMS}")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
        if v.is_finite() && (0.0..MAX_DURATION_SECS).contains(&v) {
            Ok(Seconds(Duration::from_secs_f64(v)))
        } else if v >= MAX_DURATION_SECS {
            Err(E::custom(format_args!(
                "{v:?} is not a duration: too long (less than 1e12 seconds)"
            )))
        } else {
            Err(E::custom(format_args!(
                "{v:?} is not a duration: {DURATION_FORMS}"
            )))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Seconds, E> {
        v.parse().map_err(E::custom)
    }

    refuse_wrong_types!(Seconds);
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SecondsVisitor)
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

    fn size_err(json: &str) -> String {
        match serde_json::from_str::<ByteSize>(json) {
            Ok(v) => panic!("{json} should be refused, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn duration_err(json: &str) -> String {
        match serde_json::from_str::<Seconds>(json) {
            Ok(v) => panic!("{json} should be refused, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_sizes_name_the_problem() {
        let forms = "use a number of bytes (0 or more) or a string like \"512M\"";
        for (json, starts) in [
            ("-5", "-5 is not a size: "),
            ("true", "true is not a size: "),
            ("{}", "an object is not a size: "),
            ("[1]", "a list is not a size: "),
            ("null", "null is not a size: "),
            ("\"abc\"", "\"abc\" is not a size: "),
            ("\"-1M\"", "\"-1M\" is not a size: "),
            ("\"12Q\"", "\"12Q\" is not a size: "),
        ] {
            let msg = size_err(json);
            assert!(msg.starts_with(starts), "{json}: {msg}");
            assert!(msg.contains(forms), "{json}: {msg}");
            assert!(!msg.contains("untagged"), "{json}: {msg}");
        }
        let msg = size_err("1e30");
        assert!(
            msg.starts_with("1e30 is not a size: too large (at most 18446744073709551615 bytes)"),
            "{msg}"
        );
        let msg = size_err("\"99999999999T\"");
        assert!(
            msg.starts_with("\"99999999999T\" is not a size: too large (at most "),
            "{msg}"
        );
        for json in ["1.5", "1024.0"] {
            let msg = size_err(json);
            assert!(
                msg.contains("is not a size: use a whole number of bytes"),
                "{msg}"
            );
        }
        // Lowercase, no trailing period.
        let msg = size_err("-5");
        assert!(!msg.ends_with('.'), "{msg}");
    }

    #[test]
    fn bad_durations_name_the_problem() {
        let forms = "use seconds (0 or more) or a string like \"30s\", \"5m\"";
        for (json, starts) in [
            ("-1", "-1 is not a duration: "),
            ("-0.5", "-0.5 is not a duration: "),
            ("true", "true is not a duration: "),
            ("{}", "an object is not a duration: "),
            ("\"x\"", "\"x\" is not a duration: "),
            ("\"-5s\"", "\"-5s\" is not a duration: "),
            ("\"3 weeks\"", "\"3 weeks\" is not a duration: "),
        ] {
            let msg = duration_err(json);
            assert!(msg.starts_with(starts), "{json}: {msg}");
            assert!(msg.contains(forms), "{json}: {msg}");
            assert!(!msg.contains("untagged"), "{json}: {msg}");
        }
        let msg = duration_err("1e13");
        assert!(
            msg.starts_with("10000000000000.0 is not a duration: too long"),
            "{msg}"
        );
        let msg = duration_err("\"99999999999999s\"");
        assert!(msg.contains("is not a duration: too long"), "{msg}");
    }

    #[test]
    fn good_sizes_and_durations_still_parse() {
        let size = |j: &str| serde_json::from_str::<ByteSize>(j).unwrap();
        assert_eq!(size("0"), ByteSize(0));
        assert_eq!(size("4096"), ByteSize(4096));
        assert_eq!(size("18446744073709551615"), ByteSize(u64::MAX));
        assert_eq!(size("\"512M\""), ByteSize::mib(512));
        assert_eq!(size("\"1.5K\""), ByteSize(1536));
        assert_eq!(size("\"2 GiB\""), ByteSize(2 << 30));
        assert_eq!(size("\"4096\""), ByteSize(4096));
        // Through a `serde_json::Value` too (the API re-reads some bodies that way).
        let v = serde_json::json!({"a": 7, "b": "1K"});
        let m: std::collections::BTreeMap<String, ByteSize> = serde_json::from_value(v).unwrap();
        assert_eq!(m["a"], ByteSize(7));
        assert_eq!(m["b"], ByteSize(1024));
        // Serialized as before: a number.
        assert_eq!(serde_json::to_string(&ByteSize::mib(1)).unwrap(), "1048576");

        let dur = |j: &str| serde_json::from_str::<Seconds>(j).unwrap();
        assert_eq!(dur("0"), Seconds::secs(0));
        assert_eq!(dur("30"), Seconds::secs(30));
        assert_eq!(dur("1.5").0, Duration::from_millis(1500));
        assert_eq!(dur("1e3"), Seconds::secs(1000));
        assert_eq!(dur("\"30s\""), Seconds::secs(30));
        assert_eq!(dur("\"5m\""), Seconds::secs(300));
        assert_eq!(dur("\"250ms\"").0, Duration::from_millis(250));
        // Whole numbers of seconds have no upper bound, as before.
        assert_eq!(dur("10000000000000"), Seconds::secs(10_000_000_000_000));
        assert_eq!(serde_json::to_string(&Seconds::secs(3)).unwrap(), "3");
        assert_eq!(
            serde_json::to_string(&Seconds(Duration::from_millis(1500))).unwrap(),
            "1.5"
        );
        // Optional fields still take null as "absent".
        let o: Option<Seconds> = serde_json::from_str("null").unwrap();
        assert_eq!(o, None);
    }
}
