//! Reading the limits a server announces on its answers ([`read_announced`]): every
//! rate-limit header style seen in the wild, read into one shape, [`Announced`].
//!
//! | style | headers | policy name | reset |
//! |---|---|---|---|
//! | IETF draft (2024 on) | `RateLimit-Policy: "burst";q=100;w=60` and `RateLimit: "burst";r=50;t=30` | the quoted name | `t`: seconds from now |
//! | earlier IETF drafts | `RateLimit-Limit: 100, 100;w=60`, `RateLimit-Remaining`, `RateLimit-Reset` | `ratelimit` | seconds from now |
//! | GitHub | `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Used` | `x-ratelimit` | Unix epoch seconds |
//! | Twitter/X | `x-rate-limit-limit`, `-remaining`, `-reset` | `x-rate-limit` | Unix epoch seconds |
//! | OpenAI | `x-ratelimit-limit-requests`, `-remaining-requests`, `-reset-requests` | `requests` | a duration: `6m0s`, `20ms` |
//! | OpenAI, tokens | `x-ratelimit-limit-tokens`, `-remaining-tokens`, `-reset-tokens` | `tokens` | a duration |
//! | Anthropic | `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` | `anthropic-requests` | an RFC 3339 time |
//! | Anthropic, tokens | `anthropic-ratelimit-{tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | `anthropic-tokens`, `anthropic-input-tokens`, `anthropic-output-tokens` | an RFC 3339 time |
//!
//! Servers do not always keep to their style, so every reset is read the same lenient way
//! (`parse_reset`): a number of seconds is a Unix epoch time when above 10^9 (2001-09-09:
//! no window is 31 years long) and seconds from now otherwise; a duration string, an RFC 3339
//! time and an HTTP date are read too. A reset in the past reads as zero. A limit counts
//! calls ([`Unit::Calls`]) but for OpenAI's and Anthropic's token families, which count
//! tokens (all of them, or those read or written): a call takes of them what it costs.
//!
//! The two IETF fields are Structured-Fields lists, read leniently (`parse_list`): a
//! policy name may be a token as well as a quoted string, unknown parameters are ignored, and
//! a member that does not parse is skipped without losing the others.
//!
//! Reading never fails: an answer is never failed for its rate-limit headers. A header that
//! cannot be read is logged at debug level and ignored, and so is a remaining without a
//! reset (it says nothing about when more requests may be made). One exception to that: an
//! IETF `RateLimit` entry without `t` whose policy announces its window `w` takes the window
//! as its reset, the latest the quota can be whole again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;

use crate::meter::Unit;

/// One limit a server announced on an answer: how many requests `remaining` of the policy
/// may still be made until `reset` from now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Announced {
    /// The policy's name: the IETF draft's quoted name ("burst", "daily"), or a fixed name
    /// for unnamed styles ("x-ratelimit", "ratelimit", "x-rate-limit", "requests" for OpenAI's `-requests`, "anthropic-requests").
    pub(crate) policy: String,
    /// The quota of the window, when announced.
    pub(crate) limit: Option<u64>,
    /// The window's length, when announced (`RateLimit-Policy`'s `w`).
    pub(crate) window: Option<Duration>,
    /// Requests that may still be made before the window resets.
    pub(crate) remaining: u64,
    /// Time from now until the window resets (its remaining is whole again).
    pub(crate) reset: Duration,
    /// What the limit counts: calls, or a language model's tokens.
    pub(crate) unit: Unit,
}

/// A reset number above this is Unix epoch seconds, at most this seconds from now.
const EPOCH_THRESHOLD: f64 = 1e9;

/// The header names of one unnamed style: limit, remaining and reset, and optionally the
/// requests used (which gives the remaining when only the limit is announced with it).
struct Triplet {
    policy: &'static str,
    unit: Unit,
    limit: &'static str,
    remaining: &'static str,
    reset: &'static str,
    used: Option<&'static str>,
}

/// Every unnamed style, in the order their limits are returned.
const TRIPLETS: [Triplet; 9] = [
    Triplet {
        policy: "ratelimit",
        unit: Unit::Calls,
        limit: "ratelimit-limit",
        remaining: "ratelimit-remaining",
        reset: "ratelimit-reset",
        used: None,
    },
    Triplet {
        policy: "x-ratelimit",
        unit: Unit::Calls,
        limit: "x-ratelimit-limit",
        remaining: "x-ratelimit-remaining",
        reset: "x-ratelimit-reset",
        used: Some("x-ratelimit-used"),
    },
    Triplet {
        policy: "x-rate-limit",
        unit: Unit::Calls,
        limit: "x-rate-limit-limit",
        remaining: "x-rate-limit-remaining",
        reset: "x-rate-limit-reset",
        used: None,
    },
    Triplet {
        policy: "requests",
        unit: Unit::Calls,
        limit: "x-ratelimit-limit-requests",
        remaining: "x-ratelimit-remaining-requests",
        reset: "x-ratelimit-reset-requests",
        used: None,
    },
    Triplet {
        policy: "anthropic-requests",
        unit: Unit::Calls,
        limit: "anthropic-ratelimit-requests-limit",
        remaining: "anthropic-ratelimit-requests-remaining",
        reset: "anthropic-ratelimit-requests-reset",
        used: None,
    },
    Triplet {
        policy: "tokens",
        unit: Unit::Tokens,
        limit: "x-ratelimit-limit-tokens",
        remaining: "x-ratelimit-remaining-tokens",
        reset: "x-ratelimit-reset-tokens",
        used: None,
    },
    Triplet {
        policy: "anthropic-tokens",
        unit: Unit::Tokens,
        limit: "anthropic-ratelimit-tokens-limit",
        remaining: "anthropic-ratelimit-tokens-remaining",
        reset: "anthropic-ratelimit-tokens-reset",
        used: None,
    },
    Triplet {
        policy: "anthropic-input-tokens",
        unit: Unit::InputTokens,
        limit: "anthropic-ratelimit-input-tokens-limit",
        remaining: "anthropic-ratelimit-input-tokens-remaining",
        reset: "anthropic-ratelimit-input-tokens-reset",
        used: None,
    },
    Triplet {
        policy: "anthropic-output-tokens",
        unit: Unit::OutputTokens,
        limit: "anthropic-ratelimit-output-tokens-limit",
        remaining: "anthropic-ratelimit-output-tokens-remaining",
        reset: "anthropic-ratelimit-output-tokens-reset",
        used: None,
    },
];

/// Every limit announced in `headers` (an answer's, any status). `now` is the wall clock
/// (for epoch-second and RFC 3339 resets). Unreadable headers are ignored (logged at debug,
/// never an error: an answer is never failed for its rate-limit headers); a reset in the past reads as zero.
///
/// The IETF draft's policies come first, in the order of the `RateLimit` field, then the
/// unnamed styles in the order of the table in the module documentation.
pub(crate) fn read_announced(headers: &HeaderMap, now: SystemTime) -> Vec<Announced> {
    let mut found = read_ietf(headers, now);
    found.extend(
        TRIPLETS
            .iter()
            .filter_map(|style| read_triplet(headers, now, style)),
    );
    found
}

/// The IETF draft's `RateLimit` entries, joined with `RateLimit-Policy` by name.
fn read_ietf(headers: &HeaderMap, now: SystemTime) -> Vec<Announced> {
    let Some(limits) = joined(headers, "ratelimit") else {
        return Vec::new();
    };
    let policies: Vec<(String, Option<u64>, Option<Duration>)> =
        joined(headers, "ratelimit-policy")
            .map(|text| parse_list(&text))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|member| {
                let name = member.item.name()?;
                let quota = member.param("q").and_then(Item::count);
                let window = member.param("w").and_then(Item::seconds);
                Some((name.to_owned(), quota, window))
            })
            .collect();
    let mut found = Vec::new();
    for member in parse_list(&limits) {
        let Some(name) = member.item.name() else {
            tracing::debug!(?member, "RateLimit entry without a policy name ignored");
            continue;
        };
        let policy = policies.iter().find(|(policy, _, _)| policy == name);
        let (limit, window) = policy.map_or((None, None), |&(_, q, w)| (q, w));
        let Some(remaining) = member.param("r").and_then(Item::count) else {
            tracing::debug!(
                policy = name,
                "RateLimit entry without a usable `r` ignored"
            );
            continue;
        };
        let reset = match member.param("t") {
            Some(t) => t
                .seconds_f64()
                .and_then(|secs| reset_from_seconds(secs, now)),
            None => window,
        };
        let Some(reset) = reset else {
            tracing::debug!(
                policy = name,
                "RateLimit entry without a usable `t` ignored"
            );
            continue;
        };
        found.push(Announced {
            policy: name.to_owned(),
            limit,
            window,
            remaining,
            reset,
            unit: Unit::Calls,
        });
    }
    found
}

/// One unnamed style's limit, if its remaining (or used) and reset headers are usable.
fn read_triplet(headers: &HeaderMap, now: SystemTime, style: &Triplet) -> Option<Announced> {
    let remaining_text = first(headers, style.remaining);
    let reset_text = first(headers, style.reset);
    let used_text = style.used.and_then(|name| first(headers, name));
    if remaining_text.is_none() && reset_text.is_none() && used_text.is_none() {
        return None;
    }
    let (limit, window) = match first(headers, style.limit) {
        Some(text) => parse_limit(&text),
        None => (None, None),
    };
    let remaining = match &remaining_text {
        Some(text) => parse_count(text),
        None => None,
    }
    .or_else(|| {
        let used = parse_count(used_text.as_deref()?)?;
        Some(limit?.saturating_sub(used))
    });
    let reset = reset_text
        .as_deref()
        .and_then(|text| parse_reset(text, now));
    match (remaining, reset) {
        (Some(remaining), Some(reset)) => Some(Announced {
            policy: style.policy.to_owned(),
            limit,
            window,
            remaining,
            reset,
            unit: style.unit,
        }),
        _ => {
            tracing::debug!(
                policy = style.policy,
                remaining = ?remaining_text,
                reset = ?reset_text,
                "rate-limit headers without a usable remaining and reset ignored"
            );
            None
        }
    }
}

/// The first value of header `name` as text; a value that is not visible ASCII is logged
/// and skipped.
fn first(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(name)
        .iter()
        .find_map(|value| match value.to_str() {
            Ok(text) => Some(text.to_owned()),
            Err(_) => {
                tracing::debug!(header = name, "rate-limit header not ASCII ignored");
                None
            }
        })
}

/// Every readable value of header `name` joined into one list (a Structured-Fields list may
/// be split over several lines); `None` when there is none.
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|value| match value.to_str() {
            Ok(text) => Some(text),
            Err(_) => {
                tracing::debug!(header = name, "rate-limit header not ASCII ignored");
                None
            }
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join(", "))
}

/// A limit header: the first member of a list (`100`, or `100, 100;w=60`), with the window
/// `w` of the first member announcing the same quota.
fn parse_limit(text: &str) -> (Option<u64>, Option<Duration>) {
    let members = parse_list(text);
    let Some(limit) = members.first().and_then(|m| m.item.count()) else {
        tracing::debug!(value = text, "rate-limit limit unreadable ignored");
        return (None, None);
    };
    let window = members
        .iter()
        .filter(|m| m.item.count() == Some(limit))
        .find_map(|m| m.param("w").and_then(Item::seconds));
    (Some(limit), window)
}

/// A remaining or used header: a whole non-negative number (the first member of a list).
fn parse_count(text: &str) -> Option<u64> {
    let count = parse_list(text).first().and_then(|m| m.item.count());
    if count.is_none() {
        tracing::debug!(value = text, "rate-limit count unreadable ignored");
    }
    count
}

/// A reset header, in any form servers use: seconds (epoch when above 10^9, else from now),
/// a duration string (`1m30s`), an RFC 3339 time or an HTTP date. `None` if unreadable;
/// a time in the past is zero.
pub(crate) fn parse_reset(text: &str, now: SystemTime) -> Option<Duration> {
    let text = text.trim();
    let numeric = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if numeric {
        return text
            .parse::<f64>()
            .ok()
            .and_then(|secs| reset_from_seconds(secs, now));
    }
    if let Some(wait) = parse_duration(text) {
        return Some(wait);
    }
    if let Some(at) = parse_rfc3339(text).or_else(|| httpdate::parse_http_date(text).ok()) {
        return Some(at.duration_since(now).unwrap_or(Duration::ZERO));
    }
    None
}

/// A reset given as a number of seconds: Unix epoch seconds when above 10^9, else seconds
/// from now. `None` for a negative or non-finite number.
fn reset_from_seconds(secs: f64, now: SystemTime) -> Option<Duration> {
    let span = Duration::try_from_secs_f64(secs).ok()?;
    if secs <= EPOCH_THRESHOLD {
        return Some(span);
    }
    let at = UNIX_EPOCH.checked_add(span)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A Go-style duration as OpenAI sends it: numbers, each with a unit (`h`, `m`, `s`, `ms`,
/// `us`, `µs`, `ns`, and `d`), as in `1s`, `6m0s`, `20ms`, `1h2m3.5s`.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let bytes = text.as_bytes();
    let is_number = |b: u8| b.is_ascii_digit() || b == b'.';
    let mut pos = 0;
    let mut total = 0.0f64;
    if bytes.is_empty() {
        return None;
    }
    while pos < bytes.len() {
        let start = pos;
        while pos < bytes.len() && is_number(bytes[pos]) {
            pos += 1;
        }
        // Both ends stop at ASCII bytes (or the end), so they are char boundaries.
        let number: f64 = text[start..pos].parse().ok()?;
        let unit_start = pos;
        while pos < bytes.len() && !is_number(bytes[pos]) {
            pos += 1;
        }
        let scale = match text[unit_start..pos].trim() {
            "d" => 86_400.0,
            "h" => 3_600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// An RFC 3339 time: `2024-03-15T10:30:00Z`, with an optional fraction of a second and a
/// `Z` or `±HH:MM` offset (`t`, `z` and a space separator accepted too).
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.trim().as_bytes();
    let digits = |from: usize, to: usize| -> Option<i64> {
        let part = b.get(from..to)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 7)?, digits(8, 10)?);
    let (hour, minute, second) = (digits(11, 13)?, digits(14, 16)?, digits(17, 19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut pos = 19;
    let mut nanos = 0u32;
    if at(pos, b".") {
        let start = pos + 1;
        pos = start;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        if pos == start {
            return None;
        }
        // The first nine digits, padded: nanoseconds.
        nanos = (0..9).fold(0, |n, i| {
            let digit = b.get(start + i).filter(|_| start + i < pos);
            n * 10 + digit.map_or(0, |d| u32::from(d - b'0'))
        });
    }
    let offset = if at(pos, b"Zz") {
        pos += 1;
        0
    } else if at(pos, b"+-") && at(pos + 3, b":") {
        let (hours, minutes) = (digits(pos + 1, pos + 3)?, digits(pos + 4, pos + 6)?);
        if hours > 23 || minutes > 59 {
            return None;
        }
        let sign = if b[pos] == b'-' { -1 } else { 1 };
        pos += 6;
        sign * (hours * 3600 + minutes * 60)
    } else {
        return None;
    };
    if pos != b.len() {
        return None;
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let whole = Duration::from_secs(secs.unsigned_abs());
    let at = if secs >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    at.checked_add(Duration::from_nanos(u64::from(nanos)))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A bare item of a Structured-Fields list member or parameter, as far as rate limits need.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Integer(i64),
    Decimal(f64),
    String(String),
    Token(String),
    /// A boolean, a byte sequence, or a parameter without a value.
    Other,
}

impl Item {
    /// A policy name: a string or a token.
    fn name(&self) -> Option<&str> {
        match self {
            Item::String(name) | Item::Token(name) => Some(name),
            _ => None,
        }
    }

    /// A whole non-negative number.
    fn count(&self) -> Option<u64> {
        match *self {
            Item::Integer(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }

    /// A non-negative number of seconds (decimals accepted).
    fn seconds_f64(&self) -> Option<f64> {
        let secs = match *self {
            Item::Integer(n) => n as f64,
            Item::Decimal(n) => n,
            _ => return None,
        };
        (secs.is_finite() && secs >= 0.0).then_some(secs)
    }

    /// A non-negative span of seconds.
    fn seconds(&self) -> Option<Duration> {
        Duration::try_from_secs_f64(self.seconds_f64()?).ok()
    }
}

/// One member of a Structured-Fields list: an item and its parameters.
#[derive(Debug, Clone, PartialEq)]
struct Member {
    item: Item,
    /// Keys lowercased, in order.
    params: Vec<(String, Item)>,
}

impl Member {
    /// The first parameter named `key`.
    fn param(&self, key: &str) -> Option<&Item> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// The members of a Structured-Fields list (RFC 8941), read leniently: a member that does
/// not parse is skipped (logged at debug), and what follows a member's last readable
/// parameter is ignored.
fn parse_list(text: &str) -> Vec<Member> {
    split_members(text)
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .filter_map(|part| {
            let member = parse_member(part.trim());
            if member.is_none() {
                tracing::debug!(member = part, "rate-limit list member unreadable ignored");
            }
            member
        })
        .collect()
}

/// `text` cut at the commas outside quoted strings.
fn split_members(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_member(text: &str) -> Option<Member> {
    let b = text.as_bytes();
    let mut pos = 0;
    let item = parse_item(text, &mut pos)?;
    let mut params = Vec::new();
    loop {
        skip_spaces(b, &mut pos);
        if b.get(pos) != Some(&b';') {
            break;
        }
        pos += 1;
        skip_spaces(b, &mut pos);
        let start = pos;
        while b
            .get(pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || b"_-.*".contains(c))
        {
            pos += 1;
        }
        if pos == start {
            break;
        }
        let key = text[start..pos].to_ascii_lowercase();
        skip_spaces(b, &mut pos);
        let value = if b.get(pos) == Some(&b'=') {
            pos += 1;
            skip_spaces(b, &mut pos);
            match parse_item(text, &mut pos) {
                Some(value) => value,
                None => break,
            }
        } else {
            Item::Other
        };
        params.push((key, value));
    }
    Some(Member { item, params })
}

fn skip_spaces(b: &[u8], pos: &mut usize) {
    while b.get(*pos).is_some_and(|c| *c == b' ' || *c == b'\t') {
        *pos += 1;
    }
}

/// The bare item at `pos` (moved past it), or `None`.
fn parse_item(text: &str, pos: &mut usize) -> Option<Item> {
    let b = text.as_bytes();
    let start = *pos;
    let first = *b.get(start)?;
    let take_while = |pos: &mut usize, accept: &dyn Fn(u8) -> bool| {
        while b.get(*pos).is_some_and(|c| accept(*c)) {
            *pos += 1;
        }
    };
    match first {
        b'"' => {
            let mut bytes = Vec::new();
            let mut i = start + 1;
            loop {
                match *b.get(i)? {
                    b'\\' => {
                        bytes.push(*b.get(i + 1)?);
                        i += 2;
                    }
                    b'"' => break,
                    c => {
                        bytes.push(c);
                        i += 1;
                    }
                }
            }
            *pos = i + 1;
            Some(Item::String(String::from_utf8_lossy(&bytes).into_owned()))
        }
        b'-' | b'0'..=b'9' => {
            *pos += 1;
            take_while(pos, &|c| c.is_ascii_digit() || c == b'.');
            let number = &text[start..*pos];
            if let Ok(n) = number.parse::<i64>() {
                Some(Item::Integer(n))
            } else {
                number
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite())
                    .map(Item::Decimal)
            }
        }
        b'*' | b'a'..=b'z' | b'A'..=b'Z' => {
            take_while(pos, &|c| {
                c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c)
            });
            Some(Item::Token(text[start..*pos].to_owned()))
        }
        b'?' => {
            *pos += 1;
            take_while(pos, &|c| c == b'0' || c == b'1');
            Some(Item::Other)
        }
        b':' => {
            *pos += 1;
            take_while(pos, &|c| c != b':');
            if b.get(*pos) == Some(&b':') {
                *pos += 1;
            }
            Some(Item::Other)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    /// 2024-03-15T10:30:00Z.
    const NOW_SECS: u64 = 1_710_498_600;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn read(pairs: &[(&str, &str)]) -> Vec<Announced> {
        read_announced(&headers(pairs), now())
    }

    fn announced(
        policy: &str,
        limit: Option<u64>,
        window: Option<u64>,
        remaining: u64,
        reset: Duration,
    ) -> Announced {
        Announced {
            policy: policy.to_owned(),
            limit,
            window: window.map(Duration::from_secs),
            remaining,
            reset,
            unit: Unit::Calls,
        }
    }

    /// [`announced`] of a limit counting `unit`.
    fn counting(unit: Unit, a: Announced) -> Announced {
        Announced { unit, ..a }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn no_headers_nothing_announced() {
        assert!(read(&[]).is_empty());
        assert!(read(&[("content-type", "application/json"), ("retry-after", "5")]).is_empty());
    }

    #[test]
    fn ietf_policies_joined_by_name() {
        let found = read(&[
            (
                "RateLimit-Policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("RateLimit", r#""burst";r=50;t=30, "daily";r=900;t=3600"#),
        ]);
        assert_eq!(
            found,
            vec![
                announced("burst", Some(100), Some(60), 50, secs(30)),
                announced("daily", Some(1000), Some(86_400), 900, secs(3600)),
            ]
        );
    }

    #[test]
    fn ietf_order_of_rate_limit_and_missing_policy() {
        // The entries come in RateLimit's order; one without a policy has no limit or
        // window; a policy without an entry announces nothing.
        let found = read(&[
            (
                "ratelimit-policy",
                r#""daily";q=1000;w=86400, "hourly";q=10;w=3600"#,
            ),
            ("ratelimit", r#""daily";r=0;t=10, "burst";r=5;t=1"#),
        ]);
        assert_eq!(
            found,
            vec![
                announced("daily", Some(1000), Some(86_400), 0, secs(10)),
                announced("burst", None, None, 5, secs(1)),
            ]
        );
        // No RateLimit-Policy at all.
        assert_eq!(
            read(&[("RateLimit", r#""default";r=7;t=2"#)]),
            vec![announced("default", None, None, 7, secs(2))]
        );
        // A policy alone says nothing about what remains.
        assert!(read(&[("RateLimit-Policy", r#""burst";q=100;w=60"#)]).is_empty());
    }

    #[test]
    fn ietf_lenient_syntax() {
        let found = read(&[
            // Tokens for names, spaces, unknown parameters (qu, pk, x), upper-case keys,
            // a name with a comma and an escaped quote, a decimal window.
            (
                "RateLimit-Policy",
                r#"burst ; q=100 ; w=60;qu="requests";pk=:cHsxMjM0NTY3ODl9:, "a,\"b";Q=5;w=1.5"#,
            ),
            ("RateLimit", r#"burst;r=50;t=30;x=?1;pk=:YWJj:"#),
            // A second line of the same list.
            ("RateLimit", r#""a,\"b";r=4;t=1"#),
        ]);
        assert_eq!(
            found,
            vec![
                announced("burst", Some(100), Some(60), 50, secs(30)),
                Announced {
                    policy: "a,\"b".to_owned(),
                    limit: Some(5),
                    window: Some(Duration::from_millis(1500)),
                    remaining: 4,
                    reset: secs(1),
                    unit: Unit::Calls,
                },
            ]
        );
    }

    #[test]
    fn ietf_unusable_entries_skipped_others_kept() {
        let found = read(&[
            ("RateLimit-Policy", r#""w";q=10;w=20"#),
            (
                "RateLimit",
                // No r; a negative r; a decimal r; no name; garbage; no t but the policy's
                // window; no t and no window; a good one.
                r#""a";t=5, "b";r=-1;t=5, "c";r=1.5;t=5, ;r=1;t=1, }{@, "w";r=3, "x";r=3, "ok";r=2;t=9"#,
            ),
        ]);
        assert_eq!(
            found,
            vec![
                announced("w", Some(10), Some(20), 3, secs(20)),
                announced("ok", None, None, 2, secs(9)),
            ]
        );
        // Negative or odd resets.
        assert!(read(&[("RateLimit", r#""a";r=1;t=-5, "b";r=1;t="5", "c";r=1;t=?1"#)]).is_empty());
        // Unterminated string: that member is skipped.
        assert!(read(&[("RateLimit", r#""a;r=1;t=5"#)]).is_empty());
    }

    #[test]
    fn earlier_draft_fields() {
        assert_eq!(
            read(&[
                ("RateLimit-Limit", "100"),
                ("RateLimit-Remaining", "50"),
                ("RateLimit-Reset", "30"),
            ]),
            vec![announced("ratelimit", Some(100), None, 50, secs(30))]
        );
        // With the policy form: the window of the member with the same quota.
        assert_eq!(
            read(&[
                ("RateLimit-Limit", "10, 10;w=1, 50;w=60"),
                ("RateLimit-Remaining", "9"),
                ("RateLimit-Reset", "1"),
            ]),
            vec![announced("ratelimit", Some(10), Some(1), 9, secs(1))]
        );
        assert_eq!(
            read(&[
                ("RateLimit-Limit", "100, 100;w=60"),
                ("RateLimit-Remaining", "0"),
                ("RateLimit-Reset", "59"),
            ]),
            vec![announced("ratelimit", Some(100), Some(60), 0, secs(59))]
        );
        // The newer and the earlier drafts side by side: both read.
        let found = read(&[
            ("RateLimit", r#""burst";r=50;t=30"#),
            ("RateLimit-Remaining", "50"),
            ("RateLimit-Reset", "30"),
        ]);
        assert_eq!(found.len(), 2);
        assert_eq!(found[1], announced("ratelimit", None, None, 50, secs(30)));
    }

    #[test]
    fn github_epoch_and_relative_resets() {
        let epoch = (NOW_SECS + 1800).to_string();
        assert_eq!(
            read(&[
                ("X-RateLimit-Limit", "5000"),
                ("X-RateLimit-Remaining", "4987"),
                ("X-RateLimit-Used", "13"),
                ("X-RateLimit-Reset", &epoch),
            ]),
            vec![announced("x-ratelimit", Some(5000), None, 4987, secs(1800))]
        );
        // Small enough to be seconds from now.
        assert_eq!(
            read(&[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "60")]),
            vec![announced("x-ratelimit", None, None, 3, secs(60))]
        );
        // The threshold: 10^9 is seconds, above it an epoch (long past: zero).
        let at_threshold = read(&[
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1000000000"),
        ]);
        assert_eq!(at_threshold[0].reset, secs(1_000_000_000));
        let past = read(&[
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1000000001"),
        ]);
        assert_eq!(past[0].reset, Duration::ZERO);
        // An epoch a second ago: zero. Decimal epoch seconds.
        let ago = (NOW_SECS - 1).to_string();
        let found = read(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &ago)]);
        assert_eq!(found[0].reset, Duration::ZERO);
        let decimal = format!("{}.250", NOW_SECS + 2);
        let found = read(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &decimal),
        ]);
        assert_eq!(found[0].reset, Duration::from_millis(2250));
    }

    #[test]
    fn github_used_gives_the_remaining() {
        let reset = (NOW_SECS + 60).to_string();
        assert_eq!(
            read(&[
                ("X-RateLimit-Limit", "60"),
                ("X-RateLimit-Used", "45"),
                ("X-RateLimit-Reset", &reset),
            ]),
            vec![announced("x-ratelimit", Some(60), None, 15, secs(60))]
        );
        // Used above the limit: none remain. Without a limit, used says nothing.
        let found = read(&[
            ("X-RateLimit-Limit", "60"),
            ("X-RateLimit-Used", "61"),
            ("X-RateLimit-Reset", "5"),
        ]);
        assert_eq!(found[0].remaining, 0);
        assert!(read(&[("X-RateLimit-Used", "45"), ("X-RateLimit-Reset", "5")]).is_empty());
        // The announced remaining wins over the used.
        let found = read(&[
            ("X-RateLimit-Limit", "60"),
            ("X-RateLimit-Remaining", "10"),
            ("X-RateLimit-Used", "45"),
            ("X-RateLimit-Reset", "5"),
        ]);
        assert_eq!(found[0].remaining, 10);
    }

    #[test]
    fn twitter_style() {
        let reset = (NOW_SECS + 900).to_string();
        assert_eq!(
            read(&[
                ("x-rate-limit-limit", "450"),
                ("x-rate-limit-remaining", "449"),
                ("x-rate-limit-reset", &reset),
            ]),
            vec![announced("x-rate-limit", Some(450), None, 449, secs(900))]
        );
    }

    #[test]
    fn openai_requests_and_tokens() {
        let found = read(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(
            found,
            vec![
                announced("requests", Some(60), None, 59, secs(1)),
                counting(
                    Unit::Tokens,
                    announced("tokens", Some(150_000), None, 149_984, secs(360))
                ),
            ]
        );
        let found = read(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1h2m3.5s"),
        ]);
        assert_eq!(found[0].reset, Duration::from_millis(3_723_500));
    }

    #[test]
    fn duration_strings() {
        let ms = |n: u64| Some(Duration::from_millis(n));
        assert_eq!(parse_duration("1s"), ms(1000));
        assert_eq!(parse_duration("6m0s"), ms(360_000));
        assert_eq!(parse_duration("20ms"), ms(20));
        assert_eq!(parse_duration("1h2m3.5s"), ms(3_723_500));
        assert_eq!(parse_duration("0.5s"), ms(500));
        assert_eq!(parse_duration("1m 30s"), ms(90_000));
        assert_eq!(parse_duration("2d"), ms(172_800_000));
        assert_eq!(
            parse_duration("1500us"),
            ms(1).map(|d| d + Duration::from_micros(500))
        );
        assert_eq!(parse_duration("7µs"), Some(Duration::from_micros(7)));
        assert_eq!(parse_duration("9ns"), Some(Duration::from_nanos(9)));
        for bad in [
            "", "s", "1", "1x", "1.2.3s", ".s", "-1s", "1s2", "1e9s", "1 s", "ms5",
        ] {
            // "1 s" is a number then the unit " s", trimmed: read; the rest are not.
            if bad == "1 s" {
                assert_eq!(parse_duration(bad), ms(1000));
            } else {
                assert_eq!(parse_duration(bad), None, "{bad:?}");
            }
        }
        // Too long for a Duration: unreadable, not a panic.
        assert_eq!(parse_duration(&format!("{}h", "9".repeat(400))), None);
    }

    #[test]
    fn anthropic_rfc3339_resets() {
        let found = read(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2024-03-15T10:30:42Z"),
            ("anthropic-ratelimit-tokens-limit", "40000"),
            ("anthropic-ratelimit-tokens-remaining", "39000"),
            ("anthropic-ratelimit-tokens-reset", "2024-03-15T10:31:00Z"),
            ("anthropic-ratelimit-input-tokens-limit", "30000"),
            ("anthropic-ratelimit-input-tokens-remaining", "29500"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2024-03-15T10:30:50Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7900"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2024-03-15T10:30:45Z",
            ),
        ]);
        assert_eq!(
            found,
            vec![
                announced("anthropic-requests", Some(50), None, 49, secs(42)),
                counting(
                    Unit::Tokens,
                    announced("anthropic-tokens", Some(40_000), None, 39_000, secs(60))
                ),
                counting(
                    Unit::InputTokens,
                    announced(
                        "anthropic-input-tokens",
                        Some(30_000),
                        None,
                        29_500,
                        secs(50)
                    )
                ),
                counting(
                    Unit::OutputTokens,
                    announced("anthropic-output-tokens", Some(8000), None, 7900, secs(45))
                ),
            ]
        );
        // A reset in the past reads as zero.
        let found = read(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2024-03-15T10:29:00Z"),
        ]);
        assert_eq!(found[0].reset, Duration::ZERO);
    }

    #[test]
    fn rfc3339_times() {
        let at = |s: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(s, nanos));
        assert_eq!(parse_rfc3339("2024-03-15T10:30:00Z"), at(NOW_SECS, 0));
        assert_eq!(parse_rfc3339("2024-03-15t10:30:00z"), at(NOW_SECS, 0));
        assert_eq!(parse_rfc3339("2024-03-15 10:30:00Z"), at(NOW_SECS, 0));
        assert_eq!(parse_rfc3339("2024-03-15T11:30:00+01:00"), at(NOW_SECS, 0));
        assert_eq!(parse_rfc3339("2024-03-15T05:00:00-05:30"), at(NOW_SECS, 0));
        assert_eq!(
            parse_rfc3339("2024-03-15T10:30:00.5Z"),
            at(NOW_SECS, 500_000_000)
        );
        assert_eq!(
            parse_rfc3339("2024-03-15T10:30:00.123456789123Z"),
            at(NOW_SECS, 123_456_789)
        );
        assert_eq!(parse_rfc3339("2000-02-29T23:59:59Z"), at(951_868_799, 0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(
            parse_rfc3339("1969-12-31T00:00:00Z"),
            UNIX_EPOCH.checked_sub(secs(86_400))
        );
        for bad in [
            "",
            "2024-03-15",
            "2024-03-15T10:30:00",
            "2024-03-15T10:30:00+0100",
            "2024-02-30T10:30:00Z",
            "2023-02-29T10:30:00Z",
            "2024-13-15T10:30:00Z",
            "2024-03-15T24:30:00Z",
            "2024-03-15T10:30:00.Z",
            "2024-03-15T10:30:00Zjunk",
            "2024-03-15T10:30:00+24:00",
            "２024-03-15T10:30:00Z",
            "+2024-03-15T10:30:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn resets_in_every_form() {
        let now = now();
        assert_eq!(parse_reset(" 30 ", now), Some(secs(30)));
        assert_eq!(parse_reset("0", now), Some(Duration::ZERO));
        assert_eq!(parse_reset("1.5", now), Some(Duration::from_millis(1500)));
        assert_eq!(parse_reset("2m", now), Some(secs(120)));
        assert_eq!(parse_reset("2024-03-15T10:31:00Z", now), Some(secs(60)));
        assert_eq!(
            parse_reset("Fri, 15 Mar 2024 10:32:00 GMT", now),
            Some(secs(120))
        );
        assert_eq!(
            parse_reset("Fri, 15 Mar 2024 10:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "soon", "-5", "NaN", "inf", "1e3", "..", "1.2.3", "0x10"] {
            assert_eq!(parse_reset(bad, now), None, "{bad:?}");
        }
        // Too large for a SystemTime or a Duration: unreadable, not a panic.
        assert_eq!(parse_reset(&"9".repeat(400), now), None);
        assert_eq!(parse_reset("18446744073709551616", now), None);
        // 2100-01-01: far, but a time.
        assert_eq!(
            parse_reset("4102444800", now),
            Some(secs(4_102_444_800 - NOW_SECS))
        );
    }

    #[test]
    fn several_styles_at_once() {
        let reset = (NOW_SECS + 10).to_string();
        let found = read(&[
            ("RateLimit-Policy", r#""a";q=5;w=10"#),
            ("RateLimit", r#""a";r=4;t=10"#),
            ("X-RateLimit-Remaining", "1"),
            ("X-RateLimit-Reset", &reset),
            ("x-rate-limit-remaining", "2"),
            ("x-rate-limit-reset", "3"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "20ms"),
            ("anthropic-ratelimit-requests-remaining", "4"),
            ("anthropic-ratelimit-requests-reset", "2024-03-15T10:30:05Z"),
        ]);
        let policies: Vec<&str> = found.iter().map(|a| a.policy.as_str()).collect();
        assert_eq!(
            policies,
            [
                "a",
                "x-ratelimit",
                "x-rate-limit",
                "requests",
                "anthropic-requests"
            ]
        );
        assert_eq!(found[3].reset, Duration::from_millis(20));
        assert_eq!(found[4].reset, secs(5));
    }

    #[test]
    fn garbage_values_ignored() {
        // A garbage limit leaves the rest usable.
        assert_eq!(
            read(&[
                ("X-RateLimit-Limit", "lots"),
                ("X-RateLimit-Remaining", "5"),
                ("X-RateLimit-Reset", "5"),
            ]),
            vec![announced("x-ratelimit", None, None, 5, secs(5))]
        );
        // A garbage remaining or reset, or a missing one: nothing.
        for pairs in [
            &[
                ("X-RateLimit-Remaining", "five"),
                ("X-RateLimit-Reset", "5"),
            ][..],
            &[("X-RateLimit-Remaining", "-1"), ("X-RateLimit-Reset", "5")][..],
            &[("X-RateLimit-Remaining", "1.5"), ("X-RateLimit-Reset", "5")][..],
            &[
                ("X-RateLimit-Remaining", "5"),
                ("X-RateLimit-Reset", "later"),
            ][..],
            &[("X-RateLimit-Remaining", "5")][..],
            &[("X-RateLimit-Reset", "5")][..],
            &[("X-RateLimit-Limit", "5")][..],
            &[("X-RateLimit-Remaining", ""), ("X-RateLimit-Reset", "")][..],
            &[("RateLimit", "")][..],
            &[("RateLimit", ",,,;;;===")][..],
        ] {
            assert!(read(pairs).is_empty(), "{pairs:?}");
        }
        // Values that are not ASCII are skipped; a later readable line is used.
        let mut map = HeaderMap::new();
        let name = HeaderName::from_static("x-ratelimit-remaining");
        map.append(name.clone(), HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        map.append(name, HeaderValue::from_static("8"));
        map.append(
            HeaderName::from_static("x-ratelimit-reset"),
            HeaderValue::from_static("8"),
        );
        map.append(
            HeaderName::from_static("ratelimit"),
            HeaderValue::from_bytes("\"é\";r=1;t=1".as_bytes()).unwrap(),
        );
        assert_eq!(
            read_announced(&map, now()),
            vec![announced("x-ratelimit", None, None, 8, secs(8))]
        );
    }

    /// A small deterministic generator (xorshift64*), so the fuzz cases are the same on
    /// every run.
    struct Draws(u64);

    impl Draws {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn bytes(&mut self, alphabet: &[u8], max_len: u64) -> Vec<u8> {
            let len = self.next() % (max_len + 1);
            (0..len)
                .map(|_| alphabet[(self.next() % alphabet.len() as u64) as usize])
                .collect()
        }
    }

    #[test]
    fn no_panic_on_any_input() {
        let names = [
            "ratelimit",
            "ratelimit-policy",
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "x-ratelimit-used",
            "x-rate-limit-remaining",
            "x-rate-limit-reset",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ];
        // Any byte a header value may hold, and an alphabet dense in the syntax.
        let any: Vec<u8> = (0u8..=255)
            .filter(|&b| HeaderValue::from_bytes(&[b]).is_ok())
            .collect();
        let syntax = b"\"\\,;=:?*-.0123456789 qwrtdhmsuZT+abc\xc2\xb5";
        let mut draws = Draws(0x9E37_79B9_7F4A_7C15);
        let instants = [
            UNIX_EPOCH,
            now(),
            UNIX_EPOCH + secs(u64::from(u32::MAX) * 4),
        ];
        for round in 0..3000 {
            let mut map = HeaderMap::new();
            for name in names {
                if draws.next() % 3 == 0 {
                    continue;
                }
                let alphabet = if round % 2 == 0 {
                    &any[..]
                } else {
                    &syntax[..]
                };
                let value = draws.bytes(alphabet, 40);
                if let Ok(value) = HeaderValue::from_bytes(&value) {
                    map.append(HeaderName::from_static(name), value);
                }
            }
            for &at in &instants {
                for found in read_announced(&map, at) {
                    assert!(!found.policy.is_empty() || found.remaining < u64::MAX);
                }
            }
        }
        // And the parsers alone, on any text.
        for _ in 0..3000 {
            let text = String::from_utf8_lossy(&draws.bytes(&syntax[..], 40)).into_owned();
            let _ = parse_list(&text);
            let _ = parse_duration(&text);
            let _ = parse_rfc3339(&text);
            let _ = parse_reset(&text, now());
        }
    }
}
