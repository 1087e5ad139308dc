//! How the pages write times, durations and URLs. Pure functions of their
//! arguments (the server's clock comes with the data), so the server's
//! render and the browser's hydration print the same text.

/// `2026-12-05 12:03:04.123` (UTC), or `-` for 0 (never).
pub fn clock(at_ms: u64) -> String {
    if at_ms == 0 {
        return "-".into();
    }
    use chrono::{Datelike as _, Timelike as _};
    // Fields, not `format`: chrono's format-string machinery would double
    // the browser bundle.
    match i64::try_from(at_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
    {
        Some(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
            t.year(),
            t.month(),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            at_ms % 1000
        ),
        None => format!("{at_ms} ms"),
    }
}

/// A duration in the unit that reads best: `850 ms`, `12.3 s`, `4 min 5 s`,
/// `3 h 20 min`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// How long ago `at_ms` was, seen at `now_ms`.
pub fn ago(now_ms: u64, at_ms: u64) -> String {
    if at_ms == 0 {
        return "never".into();
    }
    format!("{} ago", duration(now_ms.saturating_sub(at_ms)))
}

/// When a lease expires, seen at `now_ms`: `in 12.3 s`, or `expired`.
pub fn expires(now_ms: u64, at_ms: u64) -> String {
    if at_ms <= now_ms {
        "expired".into()
    } else {
        format!("in {}", duration(at_ms - now_ms))
    }
}

/// A value for a URL's path segment or query: every byte but letters and
/// digits percent-encoded (ids may hold any UTF-8: spaces, `/`, `<`).
pub fn url_encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The session page's path.
pub fn session_path(tenant: &str, session: &str) -> String {
    format!(
        "/dashboard/sessions/{}/{}",
        url_encode(tenant),
        url_encode(session)
    )
}

/// The first characters of a digest, enough to tell turns apart.
pub fn short_digest(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// The replica name of a holder id (`replica-0-a1b2c3` → `replica-0`).
pub fn replica_of(holder: &str) -> &str {
    match holder.rsplit_once('-') {
        Some((name, suffix))
            if suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            name
        }
        _ => holder,
    }
}

/// An SVG polyline's `points` for `values` across `width` × `height`
/// (0 at the bottom, the largest value at the top).
pub fn sparkline(values: &[f64], width: f64, height: f64) -> String {
    let top = values.iter().copied().fold(0.0_f64, f64::max);
    let step = if values.len() > 1 {
        width / (values.len() - 1) as f64
    } else {
        0.0
    };
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let y = if top > 0.0 {
                height - v / top * height
            } else {
                height
            };
            format!("{:.1},{:.1}", i as f64 * step, y)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A latency bound in ms as people read it: `0.4 ms`, `13 ms`, `1.6 s`,
/// `slower`.
pub fn latency(ms: f64) -> String {
    if !ms.is_finite() {
        "slower".into()
    } else if ms < 1.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_write_them() {
        assert_eq!(clock(0), "-");
        assert_eq!(clock(1_764_936_184_123), "2025-12-05 12:03:04.123");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_345), "12.3 s");
        assert_eq!(duration(245_000), "4 min 5 s");
        assert_eq!(duration(12_000_000), "3 h 20 min");
        assert_eq!(ago(10_000, 7_500), "2.5 s ago");
        assert_eq!(ago(10_000, 0), "never");
        assert_eq!(expires(10_000, 22_300), "in 12.3 s");
        assert_eq!(expires(10_000, 9_000), "expired");
    }

    #[test]
    fn plots_and_latencies() {
        assert_eq!(
            sparkline(&[0.0, 5.0, 10.0], 100.0, 20.0),
            "0.0,20.0 50.0,10.0 100.0,0.0"
        );
        assert_eq!(sparkline(&[0.0, 0.0], 10.0, 20.0), "0.0,20.0 10.0,20.0");
        assert_eq!(sparkline(&[], 10.0, 20.0), "");
        assert_eq!(latency(0.4), "0.40 ms");
        assert_eq!(latency(12.8), "13 ms");
        assert_eq!(latency(1638.4), "1.6 s");
        assert_eq!(latency(f64::INFINITY), "slower");
    }

    #[test]
    fn paths_and_names() {
        assert_eq!(
            session_path("acme", "a b/<c>"),
            "/dashboard/sessions/acme/a%20b%2F%3Cc%3E"
        );
        assert_eq!(replica_of("replica-0-a1b2c3"), "replica-0");
        assert_eq!(replica_of("replica-0"), "replica-0");
        assert_eq!(replica_of("web-7-zzzzzz"), "web-7-zzzzzz");
        assert_eq!(short_digest("0123456789abcdef"), "0123456789ab");
        assert_eq!(short_digest("ab"), "ab");
    }
}
