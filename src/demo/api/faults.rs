//! The fake API's configuration ([`ApiConfig`]: latency, fault shares, quota windows) and the fault each
//! ID is assigned ([`Fault`]), a pure function of the seed and the ID.

use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::llm::LlmConfig;
use super::windows::{Announce, ApiWindow};

/// How the fake API behaves: latency and the share of faulty IDs.
///
/// The five fault shares are consecutive ranges of one per-mille space (in the order
/// not-found, unavailable, drop, slow, throttled), so they are mutually exclusive per ID;
/// if they add up to more than 1000 the later ones are truncated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Uniform per-request latency range added before answering, drawn deterministically
    /// from a hash of (id, attempt). Zero = answer at once.
    pub latency_min: Duration,
    /// Upper end of the latency range (at least `latency_min`).
    pub latency_max: Duration,
    /// Per-mille of IDs (chosen by a seeded xxh3 hash of the ID) that always answer 404
    /// `{"error":"not found"}`: permanent failures.
    pub not_found_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts answer 503
    /// `{"error":"unavailable"}` (with no Retry-After header), then heal.
    pub unavailable_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts get their connection
    /// dropped without any answer, then heal.
    pub drop_per_mille: u32,
    /// Per-mille of IDs whose first `transient_attempts` attempts answer (successfully)
    /// only after `slow_delay` instead of the usual latency, then heal.
    pub slow_per_mille: u32,
    /// The delay of a slow ID's answer.
    pub slow_delay: Duration,
    /// Attempts of a transient fault before the ID heals.
    pub transient_attempts: u32,
    /// Seed for the fault hash, so different tests can pick different faulty IDs.
    pub seed: u64,
    /// Per-mille of IDs whose first `transient_attempts` attempts answer 429
    /// `{"error":"throttled"}` with a `Retry-After: <retry_after_secs>` header, then heal.
    /// 0 in every constructor.
    pub throttled_per_mille: u32,
    /// The `Retry-After` (in seconds) of [`Fault::Throttled`] answers. 1 in every constructor.
    pub retry_after_secs: u64,
    /// The `Retry-After` (in seconds) of [`Fault::Unavailable`] answers, if any. `None` in
    /// every constructor.
    pub unavailable_retry_after_secs: Option<u64>,
    /// [`Fault::NotFound`] and [`Fault::Unavailable`] answers come at once, without the
    /// latency, as a gateway's refusals do. `false` in every constructor.
    pub refusals_at_once: bool,
    /// Quota windows enforced in front of every ID ([`ApiWindow`]: fixed, aligned to the
    /// Unix epoch); a request above any of them answers 429 `{"error":"quota exceeded"}`.
    /// Empty in every constructor.
    pub windows: Vec<ApiWindow>,
    /// How the windows are announced in the answers' headers. [`Announce::None`] in every
    /// constructor.
    pub announce: Announce,
    /// Of the batch endpoint (`/batch`): per-mille of IDs its answers leave out
    /// when asked with other IDs (asked alone, they are answered). 0 in every constructor.
    pub batch_omit_per_mille: u32,
    /// Of the batch endpoint: per-mille of IDs that make their whole batch answer 400 (alone
    /// too). 0 in every constructor.
    pub batch_poison_per_mille: u32,
    /// Successful answers are company profiles of about 2 KB ([`super::profile_body`]: nested,
    /// shaped like a real API's) instead of the small item. `false` in every constructor.
    pub profiles: bool,
    /// The language-model routes' window, headers and credit ([`LlmConfig`]); without it they
    /// answer 404. `None` in every constructor.
    pub llm: Option<LlmConfig>,
    /// Items of an ID on the paginated routes (`/pages/...`) when its ID does not say
    /// (`p2000-...` has 2,000). 120 in every constructor.
    pub page_items: u64,
    /// Of the paginated routes: the page of this number (from 1) of every ID answers 503
    /// the first time it is asked for. `None` in every constructor.
    pub page_unavailable_once: Option<u64>,
    /// Of the paginated routes: the page of this number (from 1) of every ID answers 200
    /// with `{"status": "pending"}` instead of its items the first time it is asked for (an
    /// answer an `--retry-if` asks again). `None` in every constructor.
    pub page_pending_once: Option<u64>,
    /// Of the paginated routes: each item carries a `pad` of this many bytes (a string), to
    /// make an ID's items large. 0 (no `pad`) in every constructor.
    pub page_item_pad: usize,
    /// The IDs `id-000000000` to the one numbered below this (`id-` and the number
    /// zero-padded to nine digits, as the bench writes its inputs) have their calls counted
    /// in a byte each, indexed by the number, instead of in a map by name: 100 million IDs
    /// cost 100 MB of counters (allocated at the start) instead of about 10 GB. Their
    /// counts ([`super::FakeApi::calls`], and the attempt numbers the faults follow) stop at
    /// 255. 0 (every ID counted by name) in every constructor.
    pub numbered_ids: u64,
}

impl ApiConfig {
    /// No latency, no faults: for benchmarks.
    pub fn fast() -> Self {
        ApiConfig {
            latency_min: Duration::ZERO,
            latency_max: Duration::ZERO,
            not_found_per_mille: 0,
            unavailable_per_mille: 0,
            drop_per_mille: 0,
            slow_per_mille: 0,
            slow_delay: Duration::ZERO,
            transient_attempts: 0,
            seed: 0,
            throttled_per_mille: 0,
            retry_after_secs: 1,
            unavailable_retry_after_secs: None,
            refusals_at_once: false,
            windows: Vec::new(),
            announce: Announce::None,
            batch_omit_per_mille: 0,
            batch_poison_per_mille: 0,
            profiles: false,
            llm: None,
            page_items: 120,
            page_unavailable_once: None,
            page_pending_once: None,
            page_item_pad: 0,
            numbered_ids: 0,
        }
    }

    /// Realistic: latency 5..40 ms, 1% 404, 2% 503, 1% drops, 0.5% slow (3 s), each
    /// transient fault for the first attempt only.
    pub fn demo() -> Self {
        ApiConfig {
            latency_min: Duration::from_millis(5),
            latency_max: Duration::from_millis(40),
            not_found_per_mille: 10,
            unavailable_per_mille: 20,
            drop_per_mille: 10,
            slow_per_mille: 5,
            slow_delay: Duration::from_secs(3),
            transient_attempts: 1,
            seed: 0x6869_6768_7761_7465, // "highwate"
            throttled_per_mille: 0,
            retry_after_secs: 1,
            unavailable_retry_after_secs: None,
            refusals_at_once: false,
            windows: Vec::new(),
            announce: Announce::None,
            batch_omit_per_mille: 0,
            batch_poison_per_mille: 0,
            profiles: false,
            llm: None,
            page_items: 120,
            page_unavailable_once: None,
            page_pending_once: None,
            page_item_pad: 0,
            numbered_ids: 0,
        }
    }

    /// For tests: latency 0..2 ms, 2% 404, 3% 503, 2% drops, 1% slow (2 s), each
    /// transient fault for the first two attempts.
    pub fn faulty() -> Self {
        ApiConfig {
            latency_min: Duration::ZERO,
            latency_max: Duration::from_millis(2),
            not_found_per_mille: 20,
            unavailable_per_mille: 30,
            drop_per_mille: 20,
            slow_per_mille: 10,
            slow_delay: Duration::from_secs(2),
            transient_attempts: 2,
            seed: 0,
            throttled_per_mille: 0,
            retry_after_secs: 1,
            unavailable_retry_after_secs: None,
            refusals_at_once: false,
            windows: Vec::new(),
            announce: Announce::None,
            batch_omit_per_mille: 0,
            batch_poison_per_mille: 0,
            profiles: false,
            llm: None,
            page_items: 120,
            page_unavailable_once: None,
            page_pending_once: None,
            page_item_pad: 0,
            numbered_ids: 0,
        }
    }

    /// The fault of `id` under this configuration: a pure function of the seed, the
    /// per-mille shares and the ID.
    pub fn fault(&self, id: &str) -> Fault {
        let bucket = xxh3_64_with_seed(id.as_bytes(), self.seed) % 1000;
        let mut upper = 0u64;
        for (share, fault) in [
            (self.not_found_per_mille, Fault::NotFound),
            (self.unavailable_per_mille, Fault::Unavailable),
            (self.drop_per_mille, Fault::Drop),
            (self.slow_per_mille, Fault::Slow),
            (self.throttled_per_mille, Fault::Throttled),
        ] {
            upper += u64::from(share);
            if bucket < upper {
                return fault;
            }
        }
        Fault::None
    }

    /// Latency for one attempt at an ID whose unseeded hash is `id_hash`.
    pub(super) fn latency(&self, id_hash: u64, attempt: u64) -> Duration {
        if self.latency_max <= self.latency_min {
            return self.latency_min;
        }
        let span = (self.latency_max - self.latency_min).as_nanos() as u64;
        let draw = mix64(id_hash ^ attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.latency_min + Duration::from_nanos(draw % span.saturating_add(1))
    }
}

impl Default for ApiConfig {
    /// Same as [`ApiConfig::fast`].
    fn default() -> Self {
        ApiConfig::fast()
    }
}

/// The fault an ID is assigned (exactly one per ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Always answers 200.
    None,
    /// Always answers 404 `{"error":"not found"}`.
    NotFound,
    /// The first `transient_attempts` attempts answer 503, then 200.
    Unavailable,
    /// The first `transient_attempts` attempts have their connection closed without an
    /// answer, then 200.
    Drop,
    /// The first `transient_attempts` attempts answer 200 only after `slow_delay`.
    Slow,
    /// The first `transient_attempts` attempts answer 429 `{"error":"throttled"}` with
    /// `Retry-After: <retry_after_secs>` (after the usual latency), then 200.
    Throttled,
}

/// splitmix64's finalizer: a cheap, well-mixed 64-bit permutation.
pub(super) fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
