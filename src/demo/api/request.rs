//! What every route reads of a request the same way: the body's cap ([`MAX_BODY`]) and
//! percent-decoding ([`decode`]).

use percent_encoding::percent_decode_str;

/// Largest request body accepted (`POST /items`); larger bodies answer 413.
pub(super) const MAX_BODY: usize = 64 * 1024;

/// Percent-decodes `raw` (with `+` as a space if `plus_is_space`); `None` if the result
/// is not UTF-8.
pub(super) fn decode(raw: &str, plus_is_space: bool) -> Option<String> {
    let raw = if plus_is_space && raw.contains('+') {
        std::borrow::Cow::Owned(raw.replace('+', " "))
    } else {
        std::borrow::Cow::Borrowed(raw)
    };
    percent_decode_str(&raw)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}
