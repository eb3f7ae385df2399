//! Setting: the names of a job's settings in messages.
//!
//! A library error or warning that is about a setting (a template that does not parse, a
//! check that is not jq, a limit that was passed) names it with a [`Setting`], never with a
//! command-line flag: the library does not know how its caller spells its settings. By
//! default a setting reads as the library's field name (`url`, `header Authorization`,
//! `fail_if`, `max_failures`). A front end that spells them otherwise (the command line:
//! `--url`, `--header Authorization`, `--fail-if`, `--max-failures`) installs its names once
//! at start with [`name_settings`], and every message after that reads in its words.

use std::fmt;
use std::sync::OnceLock;

/// One setting of a job, a run or a rerun, as messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setting {
    /// The request's URL template.
    Url,
    /// The request's HTTP method.
    Method,
    /// One request header template, by name (no name: the header list as a whole).
    Header(Option<String>),
    /// The request's body template.
    Body,
    /// The command run per ID (an exec job).
    Exec,
    /// An exec job's exit codes that are retried.
    RetryExitCodes,
    /// Rows per bucket.
    BucketSize,
    /// The answer check "the body must be JSON".
    ExpectJson,
    /// The jq program failing an ID.
    FailIf,
    /// The jq program retrying an ID.
    RetryIf,
    /// The jq program whose output is stored.
    Extract,
    /// Keep the whole body beside what is extracted.
    KeepBody,
    /// IDs per request of a batch endpoint.
    BatchSize,
    /// The jq program splitting a batch answer into each ID's value.
    Split,
    /// How the pages of one ID's answer are followed (the style of paging).
    Paginate,
    /// The jq program giving the items kept of each page.
    Items,
    /// The query parameter or body field a page's cursor, number or offset is written to.
    PageParam,
    /// The number of the first page (paging by page number).
    PageStart,
    /// Items in a full page: a page with fewer is the last.
    PageSize,
    /// The most pages followed for one ID.
    MaxPages,
    /// The limit of permanently failed IDs in a run.
    MaxFailures,
    /// How long the API may stay unreachable before the run stops.
    MaxOutage,
    /// The rate limit (calls per second).
    Rate,
    /// The calls allowed per window (quotas, the job's budget).
    Quota,
    /// The price of a token read (input).
    PriceInput,
    /// The price of a token written (output).
    PriceOutput,
    /// The most the job may spend, by its prices.
    Budget,
    /// The jq program reading what a call cost from its answer.
    Usage,
    /// The jq program estimating what a call will cost from its request.
    Estimate,
    /// How many IDs are worked on at once.
    Concurrency,
    /// Skip input lines without a usable ID instead of stopping.
    SkipBadLines,
    /// Accept a changed request or answer check on an existing job.
    AllowSpecChange,
    /// The input.
    Input,
    /// Input columns kept of each row beside those the templates name.
    KeepColumns,
    /// A rerun of the failed IDs.
    RerunFailed,
    /// A rerun of chosen buckets.
    RerunBuckets,
    /// A rerun of every item of chosen buckets, not only the failed ones.
    RerunAllItems,
    /// A rerun of the IDs listed in a file.
    RerunIds,
    /// Where the job's state is (a directory or a database URL).
    State,
    /// The PostgreSQL database's URL.
    DatabaseUrl,
    /// One of the job's credentials, by name.
    Credential(String),
    /// The OAuth2 client ID of a credential.
    OAuth2ClientId,
    /// The OAuth2 client secret of a credential.
    OAuth2ClientSecret,
}

impl Setting {
    /// The library's name of the setting: its field's name.
    pub fn field_name(&self) -> String {
        let name = match self {
            Setting::Url => "url",
            Setting::Method => "method",
            Setting::Header(Some(name)) => return format!("header {name}"),
            Setting::Header(None) => "headers",
            Setting::Body => "body",
            Setting::Exec => "exec",
            Setting::RetryExitCodes => "retry_exit_codes",
            Setting::BucketSize => "bucket_size",
            Setting::ExpectJson => "expect_json",
            Setting::FailIf => "fail_if",
            Setting::RetryIf => "retry_if",
            Setting::Extract => "extract",
            Setting::KeepBody => "keep_body",
            Setting::BatchSize => "batch_size",
            Setting::Split => "split",
            Setting::Paginate => "paginate",
            Setting::Items => "items",
            Setting::PageParam => "page_param",
            Setting::PageStart => "page_start",
            Setting::PageSize => "page_size",
            Setting::MaxPages => "max_pages",
            Setting::MaxFailures => "max_failures",
            Setting::MaxOutage => "max_outage",
            Setting::Rate => "rate",
            Setting::Quota => "quotas",
            Setting::PriceInput => "price_input",
            Setting::PriceOutput => "price_output",
            Setting::Budget => "budget",
            Setting::Usage => "usage",
            Setting::Estimate => "estimate",
            Setting::Concurrency => "concurrency",
            Setting::SkipBadLines => "skip_bad_lines",
            Setting::AllowSpecChange => "allow_spec_change",
            Setting::Input => "input",
            Setting::KeepColumns => "keep_columns",
            Setting::RerunFailed => "rerun of the failed IDs",
            Setting::RerunBuckets => "rerun buckets",
            Setting::RerunAllItems => "all items",
            Setting::RerunIds => "rerun IDs file",
            Setting::State => "state",
            Setting::DatabaseUrl => "database URL",
            Setting::Credential(name) => return format!("credential {name}"),
            Setting::OAuth2ClientId => "oauth2_client_id",
            Setting::OAuth2ClientSecret => "oauth2_client_secret",
        };
        name.into()
    }
}

/// How a front end spells settings: `None` keeps the library's name.
pub(crate) type Namer = fn(&Setting) -> Option<String>;

static NAMER: OnceLock<Namer> = OnceLock::new();

/// Install the front end's names of settings, once per process (later calls are ignored:
/// messages must not change words half way through a run).
// The command line names the settings after its flags.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) fn name_settings(namer: Namer) {
    let _ = NAMER.set(namer);
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match NAMER.get().and_then(|namer| namer(self)) {
            Some(name) => f.write_str(&name),
            None => f.write_str(&self.field_name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_reads_as_its_field_name_by_default() {
        // No test in this crate's unit tests installs a namer (the CLI does, in its own process).
        assert_eq!(Setting::Url.field_name(), "url");
        assert_eq!(
            Setting::Header(Some("Authorization".into())).field_name(),
            "header Authorization"
        );
        assert!(!Setting::FailIf.field_name().starts_with('-'));
    }
}
