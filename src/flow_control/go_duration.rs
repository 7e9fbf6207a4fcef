//! A Go duration (`time.ParseDuration`: `60s`, `1m30s`, `500ms`, `1.5h`, `-2s`) in seconds, as
//! the Go configs flow control reads write them: an `EndpointPickerConfig`'s
//! `defaultRequestTTL` and Kthena's `FAIRNESS_WINDOW_SIZE` / `FAIRNESS_QUEUE_TIMEOUT`.
//!
//! Go's grammar: an optional sign, then one or more decimal numbers (digits with an optional
//! fraction, at least one digit) each followed by a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`,
//! `h`); the bare `0` needs no unit. No spaces.

/// The seconds `text` spells, or `None` when it is not a Go duration.
pub fn seconds(text: &str) -> Option<f64> {
    let (sign, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (-1.0, &text[1..]),
        Some(b'+') => (1.0, &text[1..]),
        _ => (1.0, text),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let split = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number = &rest[..split];
        if !number.bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        let number: f64 = number.parse().ok()?;
        rest = &rest[split..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            // Go accepts the micro sign (U+00B5) and the Greek mu (U+03BC).
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    total.is_finite().then_some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn go_durations_in_seconds() {
        for (text, want) in [
            ("0", 0.0),
            ("60s", 60.0),
            ("1m30s", 90.0),
            ("500ms", 0.5),
            ("1.5h", 5400.0),
            (".5s", 0.5),
            ("5.s", 5.0),
            ("-2s", -2.0),
            ("+1m", 60.0),
            ("250us", 0.000_25),
            ("250\u{b5}s", 0.000_25),
            ("250\u{3bc}s", 0.000_25),
            ("1h1m1s", 3661.0),
        ] {
            let got = seconds(text).unwrap_or_else(|| panic!("{text:?} refused"));
            assert!((got - want).abs() < 1e-9, "{text:?}: {got}, want {want}");
        }
    }

    #[test]
    fn what_go_refuses_is_refused() {
        for text in [
            "", "60", "s", ".s", "1x", "1 s", " 1s", "1s ", "-", "1.2.3s", "1d", "1S", "--1s",
        ] {
            assert_eq!(seconds(text), None, "{text:?}");
        }
    }
}
