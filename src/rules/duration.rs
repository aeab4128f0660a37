//! Durations in rule files: `1500ms`, `90s`, `5m`, `2h`, `1d`, `1w`, or
//! several parts in descending order such as `1h30m`.

use std::time::Duration;

/// Parses a duration; the error is the reason, for a `RuleError`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const HINT: &str = "expected a duration such as 1500ms, 90s, 5m, 2h, 1d, 1w or 1h30m";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty; {HINT}"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    // Each unit's size in ms; parts must come in descending order, each once.
    let mut last_unit_ms = u64::MAX;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("{text:?}: {HINT}"));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .bytes()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let (unit, after) = after.split_at(unit_len);
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "" => return Err(format!("{text:?}: missing unit; {HINT}")),
            other => return Err(format!("{text:?}: unknown unit {other:?}; {HINT}")),
        };
        if unit_ms >= last_unit_ms {
            return Err(format!(
                "{text:?}: units must be given largest first, each once; {HINT}"
            ));
        }
        last_unit_ms = unit_ms;
        let ms = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit_ms))
            .ok_or_else(|| format!("{text:?}: too large"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| format!("{text:?}: too large"))?;
        rest = after;
    }
    if total.is_zero() {
        return Err(format!("{text:?}: must be longer than 0"));
    }
    Ok(total)
}

/// Formats a duration the way rule files write it (largest units first).
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0ms".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("w", 7 * 86_400_000u128),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("1500ms"), Ok(ms(1500)));
        assert_eq!(parse_duration("90s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("5m"), Ok(ms(300_000)));
        assert_eq!(parse_duration("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse_duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse_duration("1w"), Ok(ms(604_800_000)));
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration(" 10s "), Ok(ms(10_000)));
    }

    #[test]
    fn bad_durations_say_why() {
        for (text, words) in [
            ("", "empty"),
            ("10", "missing unit"),
            ("10x", "unknown unit"),
            ("s", "expected a duration"),
            ("0s", "longer than 0"),
            ("1m1h", "largest first"),
            ("1s1s", "largest first"),
            ("-5s", "expected a duration"),
            ("1.5s", "expected a duration"),
            ("99999999999999999999w", "too large"),
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains(words), "{text:?}: {err}");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["1500ms", "1m30s", "2h", "1w", "1d1ms"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{text}");
        }
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s500ms");
    }
}
