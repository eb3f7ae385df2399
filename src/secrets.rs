//! Secrets: the values highwater expanded for a job (`${VAR}` from the environment in its
//! templates and credential definitions, each value a credential ever had, an OAuth2 client
//! secret), kept so that any text that came from elsewhere (an API's error answer, a
//! command's standard error) can be masked before it is stored, logged, shown or served, as
//! CI systems mask secrets in their logs ([`Secrets::mask`]: each one becomes [`MASK`]).
//!
//! A value is masked as written and in the forms an echo is likely to carry it: percent-encoded
//! (every byte but the unreserved ones, with upper- or lower-case hex; as a form encodes it,
//! a space as `+`; as a URL's path or query keeps it), percent-decoded, and as the content of
//! a JSON string. Values shorter than [`MIN_SECRET_BYTES`] are not kept: they would mask
//! ordinary text everywhere.
//!
//! Only failures are masked: a successful answer is the user's data and stays as it came.
//! Masking runs once per failure message, with one Aho-Corasick automaton over every form of
//! every value, rebuilt when a value is added (when a handler is built, when a credential is
//! renewed).
//!
//! A [`Secrets`] is a shared handle (cheap to clone): a credential keeps its own and feeds it
//! into its job's ([`Secrets::feed`]), so a value renewed mid-run reaches every masker that
//! needs it.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use aho_corasick::{AhoCorasick, MatchKind};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// What stands for a secret in masked text.
pub const MASK: &str = "***";

/// Values shorter than this (in bytes) are not masked.
pub const MIN_SECRET_BYTES: usize = 4;

/// Everything but RFC 3986 unreserved characters.
const STRICT: &AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What a URL's query keeps encoded (the WHATWG URL standard's query set, `'` included).
const QUERY: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'\'');

/// What a URL's path keeps encoded (the WHATWG path set).
const PATH: &AsciiSet = &QUERY.remove(b'\'').add(b'?').add(b'`').add(b'{').add(b'}');

/// The values to mask: a shared handle, see the module doc.
#[derive(Clone, Default)]
pub struct Secrets {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// The values added, as given.
    values: HashSet<String>,
    /// Every form of every value, each once.
    forms: Vec<String>,
    /// Finds the forms, longest first where they overlap; none while there are none.
    matcher: Option<AhoCorasick>,
    /// The longest form, in bytes.
    longest: usize,
    /// Other sets that every value of this one goes to as well.
    fed: Vec<Secrets>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("values", &self.read().values.len())
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// None yet.
    pub fn new() -> Secrets {
        Secrets::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mask `value` from now on (and in every set this one feeds); a value shorter than
    /// [`MIN_SECRET_BYTES`] is ignored.
    pub fn add(&self, value: &str) {
        if value.len() < MIN_SECRET_BYTES {
            return;
        }
        let fed = {
            let mut inner = self.write();
            if !inner.values.insert(value.to_string()) {
                return;
            }
            for form in forms(value) {
                if !inner.forms.contains(&form) {
                    inner.longest = inner.longest.max(form.len());
                    inner.forms.push(form);
                }
            }
            inner.matcher = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&inner.forms)
                .ok();
            inner.fed.clone()
        };
        // Outside the lock: a set fed in a circle stops at the value it already knows.
        for other in fed {
            other.add(value);
        }
    }

    /// `env`, noting each value it gives: what a handler's templates look `${VAR}` up with,
    /// so every value they expand is masked.
    pub fn recording<'a>(
        &'a self,
        env: &'a dyn Fn(&str) -> Option<String>,
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            let value = env(name);
            if let Some(v) = &value {
                self.add(v);
            }
            value
        }
    }

    /// Every value of this set, now and later, goes to `other` too.
    pub fn feed(&self, other: &Secrets) {
        if Arc::ptr_eq(&self.inner, &other.inner) {
            return;
        }
        let values: Vec<String> = {
            let mut inner = self.write();
            inner.fed.push(other.clone());
            inner.values.iter().cloned().collect()
        };
        for value in values {
            other.add(&value);
        }
    }

    /// Whether no value is kept.
    pub fn is_empty(&self) -> bool {
        self.read().values.is_empty()
    }

    /// The length of the longest form of a value kept, in bytes.
    pub fn longest(&self) -> usize {
        self.read().longest
    }

    /// `text` with every form of every value replaced by [`MASK`].
    pub fn mask(&self, text: &str) -> String {
        self.mask_prefix(text, usize::MAX)
    }

    /// The first `max` bytes of `text` (cut at a character boundary; further if a value
    /// stands across the cut, so that no part of one is left), masked. The cut is made in
    /// `text` as it is, before masking: a masked text is never longer than `max` bytes
    /// plus a value's form.
    pub fn mask_prefix(&self, text: &str, max: usize) -> String {
        let inner = self.read();
        let mut out = String::with_capacity(text.len().min(max));
        let mut at = 0;
        if let Some(matcher) = &inner.matcher {
            for m in matcher.find_iter(text) {
                if m.start() >= max {
                    break;
                }
                out.push_str(&text[at..m.start()]);
                out.push_str(MASK);
                at = m.end();
            }
        }
        if at < max {
            let mut end = max.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            if end > at {
                out.push_str(&text[at..end]);
            }
        }
        out
    }

    /// The last `max` bytes of `text` (from a character boundary; further back if a value
    /// stands across the cut, so that no part of one is left), masked.
    pub fn mask_suffix(&self, text: &str, max: usize) -> String {
        let mut start = text.len().saturating_sub(max);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let inner = self.read();
        if let Some(matcher) = &inner.matcher {
            if let Some(m) = matcher
                .find_iter(text)
                .take_while(|m| m.start() < start)
                .find(|m| m.end() > start)
            {
                start = m.start();
            }
        }
        drop(inner);
        self.mask(&text[start..])
    }
}

/// The forms of `value` an echo may carry (see the module doc).
fn forms(value: &str) -> Vec<String> {
    let strict = utf8_percent_encode(value, STRICT).to_string();
    let mut out = vec![
        value.to_string(),
        lower_hex(&strict),
        strict.replace("%20", "+"),
        lower_hex(&strict.replace("%20", "+")),
        strict,
        utf8_percent_encode(value, QUERY).to_string(),
        utf8_percent_encode(value, PATH).to_string(),
    ];
    if let Ok(decoded) = percent_decode_str(value).decode_utf8() {
        out.push(decoded.into_owned());
    }
    if let Ok(decoded) = percent_decode_str(&value.replace('+', " ")).decode_utf8() {
        out.push(decoded.into_owned());
    }
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json
        .get(1..json.len().saturating_sub(1))
        .unwrap_or_default();
    out.push(json.replace('/', "\\/"));
    out.push(json.to_string());
    out.retain(|f| f.len() >= MIN_SECRET_BYTES);
    out.sort();
    out.dedup();
    out
}

/// `%2F` as `%2f`: some servers re-encode with lower-case hex.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..=i]);
        let hex = rest.get(i + 1..i + 3).unwrap_or_default();
        out.push_str(&hex.to_ascii_lowercase());
        rest = &rest[i + 1 + hex.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_masked_as_written_and_encoded() {
        let s = Secrets::new();
        s.add("sk live/9+Zq==");
        for form in [
            "sk live/9+Zq==",
            "sk%20live%2F9%2BZq%3D%3D",
            "sk%20live%2f9%2bZq%3d%3d",
            "sk+live%2F9%2BZq%3D%3D",
            "sk%20live/9+Zq==",
            "sk live\\/9+Zq==",
        ] {
            assert_eq!(s.mask(&format!("a {form} b")), "a *** b", "{form}");
        }
        assert_eq!(s.mask("nothing here"), "nothing here");
    }

    #[test]
    fn short_and_empty_values_are_not_masked() {
        let s = Secrets::new();
        s.add("");
        s.add("abc");
        assert!(s.is_empty());
        assert_eq!(s.mask("abc abc"), "abc abc");
    }

    #[test]
    fn the_longest_of_overlapping_values_is_masked_whole() {
        let s = Secrets::new();
        s.add("token");
        s.add("token-2");
        assert_eq!(s.mask("token-2 token"), "*** ***");
    }

    #[test]
    fn a_prefix_never_keeps_part_of_a_value() {
        let s = Secrets::new();
        s.add("0123456789");
        let text = "abc0123456789def";
        assert_eq!(s.mask_prefix(text, 5), "abc***");
        assert_eq!(s.mask_prefix(text, 3), "abc");
        assert_eq!(s.mask_prefix(text, 14), "abc***d");
        assert_eq!(s.mask_prefix("éé", 3), "é");
        // Masks shorten the text: what follows the cut does not move into it.
        assert_eq!(s.mask_prefix("0123456789 0123456789", 12), "*** ***");
        assert_eq!(s.mask_prefix("0123456789 012345", 12), "*** 0");
    }

    #[test]
    fn a_suffix_never_keeps_part_of_a_value() {
        let s = Secrets::new();
        s.add("0123456789");
        let text = "abc0123456789def";
        assert_eq!(s.mask_suffix(text, 5), "***def");
        assert_eq!(s.mask_suffix(text, 3), "def");
        assert_eq!(s.mask_suffix(text, 100), "abc***def");
        assert_eq!(s.mask_suffix("éé", 3), "é");
    }

    #[test]
    fn a_fed_set_gets_values_added_later() {
        let own = Secrets::new();
        own.add("first-value");
        let job = Secrets::new();
        own.feed(&job);
        own.add("renewed-value");
        job.feed(&own);
        assert_eq!(job.mask("first-value renewed-value"), "*** ***");
        assert!(!format!("{own:?}").contains("first-value"));
    }
}
