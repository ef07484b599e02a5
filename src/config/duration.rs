//! Human durations such as `250ms`, `10s`, `1m`, `1h`, `1d`.

use std::time::Duration;

/// Parses `<integer><unit>` with unit one of `us`, `ms`, `s`, `m`, `h`, `d`.
///
/// Guarantees: never panics; rejects a missing unit, a fraction, a negative or an
/// overflowing value with a message meant for a person.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "invalid duration `{text}`: expected a whole number and a unit, such as 250ms, 10s, 1m or 1h"
        ));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration `{text}`: number too large"))?;
    let micros_per_unit: u64 = match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        "" => {
            return Err(format!(
                "invalid duration `{text}`: missing unit (us, ms, s, m, h or d), such as {text}s"
            ))
        }
        other => {
            return Err(format!(
                "invalid duration `{text}`: unknown unit `{other}` (use us, ms, s, m, h or d)"
            ))
        }
    };
    let micros = value
        .checked_mul(micros_per_unit)
        .ok_or_else(|| format!("invalid duration `{text}`: too large"))?;
    Ok(Duration::from_micros(micros))
}

/// Formats a duration the way the file writes it (`250ms`, `10s`, `1m`, `1h`).
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    for (unit, size) in [
        ("d", 86_400_000_000u128),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ] {
        if us >= size && us.is_multiple_of(size) {
            return format!("{}{unit}", us / size);
        }
    }
    format!("{us}us")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("5us"), Ok(Duration::from_micros(5)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10 parsecs",
            "99999999999999999999s",
            "18446744073709551615h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should be rejected");
        }
    }
}
