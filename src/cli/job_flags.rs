//! What `run`'s (and `rerun`'s) flags make: the library's [`JobRequest`] (the job's input,
//! work, answer checks, quotas, prices, credentials, pagination) and [`RunOptions`] (this
//! run's knobs), each flag validated once, here, with messages that name the flags.

use super::args::{ClientAuthArg, ExpectArg, FormatArg, OnOff, RunArgs};
use crate::credential::oauth2::ClientAuth;
use crate::credential::{CredentialKind, CredentialSpec};
use crate::input::{folder_format, format_from_extension, is_folder_input, InputFormat, InputSpec};
use crate::job::{Durability, JobRequest, RetryOverrides, RunOptions};
use crate::throttle::ThrottleOptions;

impl RunArgs {
    pub(crate) fn input_spec(&self) -> Result<Option<InputSpec>, String> {
        let Some(path) = &self.input else {
            if self.input_format.is_some() || self.id_column.is_some() || self.id_field.is_some() {
                return Err("--input-format, --id-column and --id-field need --input".into());
            }
            return Ok(None);
        };
        let path = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .map_err(|e| format!("--input {}: {e}", path.display()))?;
        let format = match self.input_format {
            Some(FormatArg::Text) => "text",
            Some(FormatArg::Csv) => "csv",
            Some(FormatArg::Jsonl) => "jsonl",
            Some(FormatArg::Parquet) => "parquet",
            None if is_folder_input(&path) => folder_format(&path).map_err(|e| e.to_string())?,
            None => format_from_extension(&path),
        };
        let format = match format {
            "csv" => InputFormat::Csv {
                column: self
                    .id_column
                    .clone()
                    .ok_or("a CSV input needs --id-column NAME")?,
            },
            "jsonl" => InputFormat::Jsonl {
                field: self
                    .id_field
                    .clone()
                    .ok_or("a JSONL input needs --id-field NAME")?,
            },
            "parquet" => InputFormat::Parquet {
                column: self
                    .id_column
                    .clone()
                    .ok_or("a Parquet input needs --id-column NAME")?,
            },
            _ => InputFormat::Text,
        };
        match (&format, &self.id_column, &self.id_field) {
            (InputFormat::Csv { .. } | InputFormat::Parquet { .. }, _, None)
            | (InputFormat::Jsonl { .. }, None, _)
            | (InputFormat::Text, None, None) => {}
            _ => {
                return Err(format!(
                "--id-column goes with CSV or Parquet input and --id-field with JSONL; this input is {format}"
            ))
            }
        }
        Ok(Some(InputSpec { path, format }))
    }

    /// `--quota` as the job asks for it: none given keeps the stored ones; `none` alone
    /// removes them.
    fn quota_list(&self) -> Result<Option<Vec<crate::quota::Quota>>, String> {
        if self.quotas.is_empty() {
            return Ok(None);
        }
        let given: Vec<_> = self.quotas.iter().flatten().copied().collect();
        if !given.is_empty() && given.len() < self.quotas.len() {
            return Err("--quota none removes every quota: give it alone".into());
        }
        Ok(Some(given))
    }

    pub(crate) fn request(&self) -> Result<JobRequest, String> {
        Ok(JobRequest {
            input: self.input_spec()?,
            bucket_size: self.bucket_size,
            method: self.method.clone(),
            url: self.url.clone(),
            exec: self.exec.clone(),
            retry_exit_codes: self.retry_exit_codes.clone(),
            handler: None,
            headers: if self.headers.is_empty() {
                None
            } else {
                Some(self.headers.clone())
            },
            body: self.body.clone(),
            credentials: self.credentials()?,
            keep_columns: (!self.keep_columns.is_empty()).then(|| self.keep_columns.clone()),
            batch: self.batch()?,
            paginate: self.paginate()?,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            retry: RetryOverrides {
                max_attempts: self.max_attempts,
                initial: self.retry_initial,
                max_interval: self.retry_max,
                max_elapsed: self.max_retry_time,
            },
            answer: crate::job::AnswerRequest {
                expect_json: self.expect.map(|e| e == ExpectArg::Json),
                fail_if: self.fail_if.clone(),
                retry_if: self.retry_if.clone(),
                extract: self.extract.clone(),
                keep_body: self.keep_body.then_some(true),
                usage: self.usage.clone(),
                estimate: self.estimate.clone(),
            },
            quotas: self.quota_list()?,
            price_input: self.price_input,
            price_output: self.price_output,
            budget: self.budget.map(|b| b.0),
            allow_spec_change: self.allow_spec_change,
            command: "run".into(),
        })
    }

    /// The batch endpoint the flags define: `None` without `--batch-size` (a resume keeps
    /// the stored one).
    fn batch(&self) -> Result<Option<crate::handler::batch::BatchSpec>, String> {
        match (self.batch_size, &self.split) {
            (None, None) if self.batch_separator.is_none() => Ok(None),
            (Some(size), Some(split)) => Ok(Some(crate::handler::batch::BatchSpec {
                size: size as usize,
                separator: self
                    .batch_separator
                    .clone()
                    .unwrap_or_else(|| crate::handler::batch::DEFAULT_SEPARATOR.into()),
                split: split.clone(),
            })),
            (Some(_), None) => Err("--batch-size needs --split JQ: how the answer is split \
                into each ID's part (e.g. '.results[] | {key: .id, value: .}')"
                .into()),
            _ => Err("--split and --batch-separator go with --batch-size N".into()),
        }
    }

    /// How the pages of each ID's answer are followed, as the flags say: `None` without
    /// `--paginate`. Flags of paging without it, and what does not go with it, are refused.
    fn paginate(&self) -> Result<Option<crate::handler::paginate::PaginateSpec>, String> {
        use crate::handler::paginate::{PageStyle, Pager, PaginateSpec, DEFAULT_MAX_PAGES};
        let Some(style) = &self.paginate else {
            let stray: Vec<&str> = [
                (self.items.is_some(), "--items"),
                (self.page_param.is_some(), "--page-param"),
                (self.page_start.is_some(), "--page-start"),
                (self.page_size.is_some(), "--page-size"),
                (self.max_pages.is_some(), "--max-pages"),
            ]
            .into_iter()
            .filter_map(|(given, flag)| given.then_some(flag))
            .collect();
            return match stray.as_slice() {
                [] => Ok(None),
                [flag] => Err(format!("{flag} goes with --paginate STYLE")),
                flags => Err(format!("{} go with --paginate STYLE", flags.join(", "))),
            };
        };
        let refused: Vec<&str> = [
            (
                self.exec.is_some(),
                "--exec (a command's output is one answer)",
            ),
            (
                self.batch_size.is_some(),
                "--batch-size (a batch answer is split by ID, not paged)",
            ),
            (
                self.extract.is_some(),
                "--extract (--items says what is kept of each page)",
            ),
            (self.keep_body, "--keep-body (a paged answer is its items)"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect();
        if !refused.is_empty() {
            return Err(format!(
                "--paginate does not go with {}",
                refused.join(", nor with ")
            ));
        }
        let Some(items) = &self.items else {
            return Err(
                "--paginate needs --items JQ: what is kept of each page, one item \
                per output (e.g. '.data[]')"
                    .into(),
            );
        };
        let style = PageStyle::parse(
            style,
            self.page_param.as_deref(),
            self.page_start,
            self.page_size,
        )
        .map_err(|e| e.to_string())?;
        let spec = PaginateSpec {
            style,
            items: items.clone(),
            max_pages: self.max_pages.unwrap_or(DEFAULT_MAX_PAGES),
        };
        Pager::compile(&spec).map_err(|e| e.to_string())?;
        Ok(Some(spec))
    }

    /// The credentials the flags define: `None` when no credential flag is given (a resume
    /// keeps the stored ones).
    fn credentials(&self) -> Result<Option<Vec<CredentialSpec>>, String> {
        let none = self.credential_command.is_empty() && self.credential_oauth2.is_empty();
        if none && (self.credential_every.is_some() || self.credential_renew_on_403) {
            return Err("--credential-every and --credential-renew-on-403 go with \
                --credential-command or --credential-oauth2"
                .into());
        }
        let client = [
            self.oauth2_client_id.is_some(),
            self.oauth2_client_secret.is_some(),
            self.oauth2_scope.is_some(),
            self.oauth2_client_auth.is_some(),
        ];
        if self.credential_oauth2.is_empty() && client.contains(&true) {
            return Err(
                "--oauth2-client-id, --oauth2-client-secret, --oauth2-scope and \
                 --oauth2-client-auth go with --credential-oauth2"
                    .into(),
            );
        }
        if none {
            return Ok(None);
        }
        let split = |flag: &str, text: &str| -> Result<(String, String), String> {
            match text.split_once('=') {
                Some((name, rest)) if !name.trim().is_empty() && !rest.trim().is_empty() => {
                    Ok((name.trim().to_string(), rest.trim().to_string()))
                }
                _ => Err(format!("{flag} {text:?}: write NAME=VALUE")),
            }
        };
        let mut list = Vec::new();
        for text in &self.credential_command {
            let (name, command) = split("--credential-command", text)?;
            list.push((name, CredentialKind::Command { command }));
        }
        for text in &self.credential_oauth2 {
            let (name, token_url) = split("--credential-oauth2", text)?;
            let (Some(client_id), Some(client_secret)) =
                (&self.oauth2_client_id, &self.oauth2_client_secret)
            else {
                return Err(
                    "--credential-oauth2 needs --oauth2-client-id and --oauth2-client-secret"
                        .into(),
                );
            };
            if !client_secret.contains("${") {
                return Err(
                    "--oauth2-client-secret takes the name of an environment variable \
                     ('${CLIENT_SECRET}'): a secret written out would be stored with the job"
                        .into(),
                );
            }
            list.push((
                name,
                CredentialKind::OAuth2 {
                    token_url,
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                    scope: self.oauth2_scope.clone(),
                    client_auth: match self.oauth2_client_auth {
                        None | Some(ClientAuthArg::Basic) => ClientAuth::Basic,
                        Some(ClientAuthArg::Post) => ClientAuth::Post,
                    },
                },
            ));
        }
        Ok(Some(
            list.into_iter()
                .map(|(name, kind)| CredentialSpec {
                    name,
                    kind,
                    every: self.credential_every,
                    renew_on_403: self.credential_renew_on_403,
                })
                .collect(),
        ))
    }

    pub(crate) fn options(&self) -> RunOptions {
        RunOptions {
            concurrency: self.concurrency as usize,
            skip_bad_lines: self.skip_bad_lines,
            shutdown_timeout: self.shutdown_timeout,
            progress_interval: self.progress_interval,
            history_interval: self.history_interval,
            throttle: ThrottleOptions {
                rate: self.rate,
                burst: self.burst,
                adaptive: self.adaptive == OnOff::On,
                min_rate: self.min_rate,
                initial_rate: self.initial_rate,
                kp: self.kp,
                ki: self.ki,
                kd: self.kd,
                max_outage: self.max_outage,
                ..ThrottleOptions::default()
            },
            max_failures: self.max_failures,
            durability: if self.async_progress {
                Durability::Async {
                    interval: self.checkpoint_interval,
                }
            } else {
                Durability::Sync
            },
            clock: crate::clock::Clock::system(),
        }
    }
}
