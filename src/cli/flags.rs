//! Flags: the command line's spelling of the library's settings.
//!
//! The library names a setting in its messages with [`Setting`] (its field name: `url`,
//! `fail_if`); [`install`] makes every message of this process name the flag instead
//! (`--url`, `--fail-if`), so an error points at what the user typed.

use crate::setting::{name_settings, Setting};

/// Name settings by their flags for the rest of the process.
pub(super) fn install() {
    name_settings(flag);
}

/// The flag that sets `setting`.
fn flag(setting: &Setting) -> Option<String> {
    let name = match setting {
        Setting::Url => "--url",
        Setting::Method => "--method",
        Setting::Header(Some(name)) => return Some(format!("--header {name}")),
        Setting::Header(None) => "--header",
        Setting::Body => "--body",
        Setting::Exec => "--exec",
        Setting::RetryExitCodes => "--retry-exit-codes",
        Setting::BucketSize => "--bucket-size",
        Setting::ExpectJson => "--expect",
        Setting::FailIf => "--fail-if",
        Setting::RetryIf => "--retry-if",
        Setting::Extract => "--extract",
        Setting::KeepBody => "--keep-body",
        Setting::BatchSize => "--batch-size",
        Setting::Split => "--split",
        Setting::Paginate => "--paginate",
        Setting::Items => "--items",
        Setting::PageParam => "--page-param",
        Setting::PageStart => "--page-start",
        Setting::PageSize => "--page-size",
        Setting::MaxPages => "--max-pages",
        Setting::MaxFailures => "--max-failures",
        Setting::MaxOutage => "--max-outage",
        Setting::Rate => "--rate",
        Setting::Quota => "--quota",
        Setting::PriceInput => "--price-input",
        Setting::PriceOutput => "--price-output",
        Setting::Budget => "--budget",
        Setting::Usage => "--usage",
        Setting::Estimate => "--estimate",
        Setting::Concurrency => "--concurrency",
        Setting::SkipBadLines => "--skip-bad-lines",
        Setting::AllowSpecChange => "--allow-spec-change",
        Setting::Input => "--input",
        Setting::KeepColumns => "--keep-columns",
        Setting::RerunFailed => "--failed",
        Setting::RerunBuckets => "--buckets",
        Setting::RerunAllItems => "--all-items",
        Setting::RerunIds => "--ids",
        Setting::State | Setting::DatabaseUrl => "--state",
        Setting::OAuth2ClientId => "--oauth2-client-id",
        Setting::OAuth2ClientSecret => "--oauth2-client-secret",
        // The credential's own name: the flag that defines it is one of two.
        Setting::Credential(_) => return None,
    };
    Some(name.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_a_flag() {
        for s in [
            Setting::Url,
            Setting::Header(Some("X-Key".into())),
            Setting::ExpectJson,
            Setting::FailIf,
            Setting::RerunIds,
            Setting::DatabaseUrl,
        ] {
            let f = flag(&s).unwrap();
            assert!(f.starts_with("--"), "{s:?}: {f}");
        }
        assert_eq!(
            flag(&Setting::Header(Some("X-Key".into()))).unwrap(),
            "--header X-Key"
        );
    }
}
