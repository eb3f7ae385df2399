//! The rate-limit headers of the language-model API's answers, in OpenAI's style (resets as
//! Go durations: [`go_duration`]) or Anthropic's (resets as RFC 3339 times).

use std::time::{Duration, UNIX_EPOCH};

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use super::config::LlmHeaders;
use super::meter::Standing;

/// Adds the headers of `style` for the window's `standing` at `now_ms`.
pub(crate) fn announce(
    headers: &mut HeaderMap,
    style: LlmHeaders,
    standing: Standing,
    now_ms: u64,
) {
    let s = standing;
    match style {
        LlmHeaders::None => {}
        LlmHeaders::OpenAi => {
            // Both limits share the window: the same reset.
            let reset = go_duration(Duration::from_millis(s.end_ms.saturating_sub(now_ms)));
            for (name, value) in [
                ("x-ratelimit-limit-requests", s.requests_limit.to_string()),
                ("x-ratelimit-limit-tokens", s.tokens_limit.to_string()),
                (
                    "x-ratelimit-remaining-requests",
                    s.requests_remaining.to_string(),
                ),
                (
                    "x-ratelimit-remaining-tokens",
                    s.tokens_remaining.to_string(),
                ),
                ("x-ratelimit-reset-requests", reset.clone()),
                ("x-ratelimit-reset-tokens", reset),
            ] {
                insert(headers, name, value);
            }
        }
        LlmHeaders::Anthropic => {
            // Rounded up to the second, as RFC 3339 times are sent: never too early.
            let end = UNIX_EPOCH + Duration::from_secs(s.end_ms.div_ceil(1000));
            let reset = humantime::format_rfc3339_seconds(end).to_string();
            let families = [
                ("requests", s.requests_limit, s.requests_remaining),
                ("tokens", s.tokens_limit, s.tokens_remaining),
                ("input-tokens", s.tokens_limit, s.tokens_remaining),
                ("output-tokens", s.tokens_limit, s.tokens_remaining),
            ];
            for (family, limit, remaining) in families {
                let name = |part: &str| format!("anthropic-ratelimit-{family}-{part}");
                insert(headers, &name("limit"), limit.to_string());
                insert(headers, &name("remaining"), remaining.to_string());
                insert(headers, &name("reset"), reset.clone());
            }
        }
    }
}

/// `d` as Go's `time.Duration` prints it, to the millisecond: `0s`, `120ms`, `1s`, `59.5s`,
/// `6m0s`, `1h0m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let hours = ms / 3_600_000;
    let minutes = ms / 60_000 % 60;
    let seconds_ms = ms % 60_000;
    let mut seconds = (seconds_ms / 1000).to_string();
    let frac = seconds_ms % 1000;
    if frac != 0 {
        let digits = format!("{frac:03}");
        seconds.push('.');
        seconds.push_str(digits.trim_end_matches('0'));
    }
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// Sets header `name` to `value` (names and values here are always valid).
fn insert(headers: &mut HeaderMap, name: &str, value: String) {
    match (HeaderName::try_from(name), HeaderValue::try_from(value)) {
        (Ok(name), Ok(value)) => {
            headers.insert(name, value);
        }
        _ => tracing::warn!("fake API: header {name} not set"),
    }
}
