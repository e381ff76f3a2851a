//! The numbers of INCRBYFLOAT and HINCRBYFLOAT.
//!
//! Redis adds them as 80-bit long doubles and stores the sum printed with 17 decimal places,
//! trailing zeros cut, so the decimals people add print as they expect: `0.1` plus `0.2` is `0.3`
//! (an f64 sum would print `0.30000000000000004`). Chorus adds them as exact decimals with 17
//! places: the same results for such numbers, and the same on every replica by construction
//! (integer arithmetic, no floating-point unit). The range kept exactly is ±1.7 × 10^21; Redis
//! goes further, with rounding noise in the last digits there. Hexadecimal floats (`0x1p3`),
//! which Redis takes, are refused.

use std::fmt;

/// Decimal places kept, as many as Redis prints.
const PLACES: u32 = 17;
const ONE: i128 = 10i128.pow(PLACES);
/// Longest number Redis reads (`MAX_LONG_DOUBLE_CHARS`).
const MAX_CHARS: usize = 5 * 1024;

/// A number with 17 decimal places: the value times 10^17.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decimal(i128);

/// A float as Redis reads one (`string2ld`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float {
    Finite(Decimal),
    /// `inf` or `infinity`, either sign: read, but no sum may be infinite.
    Infinite,
}

/// Reads `arg` as Redis reads a long double: optional sign, digits with at most one point (at
/// least one digit), an optional exponent; or `inf` / `infinity`. `None` for anything else,
/// including numbers outside the range kept exactly.
pub fn parse_float(arg: &[u8]) -> Option<Float> {
    if arg.is_empty() || arg.len() >= MAX_CHARS || arg[0].is_ascii_whitespace() {
        return None;
    }
    let (negative, rest) = match arg[0] {
        b'-' => (true, &arg[1..]),
        b'+' => (false, &arg[1..]),
        _ => (false, arg),
    };
    if rest.eq_ignore_ascii_case(b"inf") || rest.eq_ignore_ascii_case(b"infinity") {
        return Some(Float::Infinite);
    }
    let mut digits = Vec::new();
    let mut fraction_digits = 0i64;
    let (mut seen_digit, mut seen_point) = (false, false);
    let mut i = 0;
    while let Some(&c) = rest.get(i) {
        match c {
            b'0'..=b'9' => {
                seen_digit = true;
                if !(digits.is_empty() && c == b'0') {
                    digits.push(c - b'0');
                }
                fraction_digits += i64::from(seen_point);
            }
            b'.' if !seen_point => seen_point = true,
            _ => break,
        }
        i += 1;
    }
    if !seen_digit {
        return None;
    }
    let mut exponent = 0i64;
    if i < rest.len() {
        if !matches!(rest[i], b'e' | b'E') {
            return None;
        }
        let written = &rest[i + 1..];
        let (exponent_negative, exponent_digits) = match written.first() {
            Some(b'-') => (true, &written[1..]),
            Some(b'+') => (false, &written[1..]),
            _ => (false, written),
        };
        if exponent_digits.is_empty() || !exponent_digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        for d in exponent_digits {
            // Far past any exponent that fits: the number is refused or rounds to zero below.
            exponent = (exponent * 10 + i64::from(d - b'0')).min(1 << 32);
        }
        if exponent_negative {
            exponent = -exponent;
        }
    }
    // The value times 10^17 is the digits times 10^shift.
    let shift = exponent - fraction_digits + i64::from(PLACES);
    let magnitude = scale(&digits, shift)?;
    Some(Float::Finite(Decimal(if negative { -magnitude } else { magnitude })))
}

/// The integer `digits` times 10^`shift`, rounded half away from zero; `None` past i128.
fn scale(digits: &[u8], shift: i64) -> Option<i128> {
    if digits.is_empty() {
        return Some(0);
    }
    let kept = (digits.len() as i64 + shift.min(0)).max(0) as usize;
    let mut value: i128 = 0;
    for d in &digits[..kept] {
        value = value.checked_mul(10)?.checked_add(i128::from(*d))?;
    }
    if shift > 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(shift).ok()?)?)?;
    } else if digits.get(kept).is_some_and(|first_dropped| *first_dropped >= 5) {
        value = value.checked_add(1)?;
    }
    Some(value)
}

impl Decimal {
    /// The sum, or `None` outside the range kept exactly.
    pub fn checked_add(self, other: Decimal) -> Option<Decimal> {
        self.0.checked_add(other.0).map(Decimal)
    }
}

/// As Redis prints a long double for people: 17 decimal places, trailing zeros (and a trailing
/// point) cut.
impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let magnitude = self.0.unsigned_abs();
        let (whole, fraction) = (magnitude / ONE as u128, magnitude % ONE as u128);
        let sign = if self.0 < 0 { "-" } else { "" };
        if fraction == 0 {
            return write!(f, "{sign}{whole}");
        }
        let fraction = format!("{fraction:017}");
        write!(f, "{sign}{whole}.{}", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(a: &str, b: &str) -> String {
        let (Some(Float::Finite(a)), Some(Float::Finite(b))) = (parse_float(a.as_bytes()), parse_float(b.as_bytes()))
        else {
            panic!("{a} or {b} is not a finite float");
        };
        a.checked_add(b).unwrap().to_string()
    }

    #[test]
    fn sums_print_as_redis_prints_them() {
        assert_eq!(sum("0.1", "0.2"), "0.3");
        assert_eq!(sum("10.50", "0.1"), "10.6");
        assert_eq!(sum("5.0e3", "2.0e2"), "5200");
        assert_eq!(sum("3", "-3"), "0");
        assert_eq!(sum("-1.5", "0.25"), "-1.25");
        assert_eq!(sum(".5", "1."), "1.5");
        assert_eq!(sum("1e-17", "0"), "0.00000000000000001");
        assert_eq!(sum("4e-18", "0"), "0", "below the 17th place rounds away");
        assert_eq!(sum("6e-18", "0"), "0.00000000000000001");
        assert_eq!(sum("+7", "0.000"), "7");
        assert_eq!(sum("1000000000000000000000", "1"), "1000000000000000000001");
    }

    #[test]
    fn what_redis_refuses_is_refused() {
        for bad in [
            "", " 1", "1 ", "abc", ".", "-", "1e", "1e+", "1.2.3", "--1", "nan", "1x", "0x10",
        ] {
            assert_eq!(parse_float(bad.as_bytes()), None, "{bad:?}");
        }
        for inf in ["inf", "-Infinity", "+INF"] {
            assert_eq!(parse_float(inf.as_bytes()), Some(Float::Infinite), "{inf}");
        }
        assert_eq!(parse_float(b"1e30"), None, "outside the range kept exactly");
        assert_eq!(parse_float(b"1e-9999999999"), Some(Float::Finite(Decimal(0))));
        let max = Decimal(i128::MAX);
        assert_eq!(max.checked_add(Decimal(1)), None);
    }
}
