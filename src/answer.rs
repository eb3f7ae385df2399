//! Answer: what is checked of each answer, and what of it is kept as the result.
//!
//! Owns a job's answer checks ([`AnswerSpec`], stored in the job's spec) compiled once into
//! an [`Answer`]: jq programs run by jaq, with `$status` (the HTTP status, a number; null
//! for an exec job's output) and `$headers` (an object of lower-case names, repeated headers
//! joined by `", "`; empty for exec output) bound. The answers judged are the 2xx answers of
//! the HTTP handler and the standard output of the exec handler's processes that exited 0
//! (a failing status or exit code is classified by its handler first), in this order:
//!
//! 1. `expect json`: a body that is not one JSON document (or is empty) is a retryable
//!    failure of class `body` (an HTML page from a proxy, a truncated document);
//! 2. `fail-if`: true, and the ID fails for good, class `invalid`;
//! 3. `retry-if`: true, and the attempt is retried with backoff, class `invalid`;
//! 4. `extract`: its one output is what is stored instead of the body (with `keep body`,
//!    `{"extract": output, "raw": body}`).
//!
//! Each failure's message names the condition that matched and shows the start of the answer.
//! A program's input is the body parsed as JSON, or, when it is not JSON, the body as a JSON
//! string: the value that would be stored. A condition holds when one of its outputs is
//! neither `false` nor `null`. A program that errors on an answer (indexing a string, say)
//! fails that ID for good, class `invalid`, with jq's message: never the run.
//!
//! A batch answer (several IDs per request, [`Splitter`]) is first split into each ID's
//! value; the checks then judge each value as if it were that ID's own answer.
//!
//! A paginated job's programs (what is kept of each page, where the next page is) are
//! compiled the same way (`PageProgram`), with `$page` and `$count` bound besides;
//! [`crate::handler::paginate`] says what their outputs mean.
//!
//! The programs see only the answer: `env` and `$ENV` are left out, so a program cannot copy
//! a secret from the environment into a result, and `halt` fails the one ID like any other
//! error of a program (it never stops the process).

use std::fmt;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, Compiler, Ctx, Vars};
use jaq_json::Val;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::failure::{ErrorClass, Failure, Next};
use crate::setting::Setting;

/// How much of an answer a failure's message shows.
const SNIPPET_CHARS: usize = 200;

/// Native filters a program may not use (see the module doc).
const LEFT_OUT: [&str; 1] = ["env"];

/// A job's answer checks, as written; stored in the job's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerSpec {
    /// A body that is not JSON is a retryable failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expect_json: bool,
    /// jq: true fails the ID for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_if: Option<String>,
    /// jq: true retries the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_if: Option<String>,
    /// jq: its output is stored instead of the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extract: Option<String>,
    /// With `extract`: store the raw body beside its output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_body: bool,
    /// jq over the answer: what the call cost, for an API whose answers carry no usage of a
    /// language model's shape (a number of units, or `{input, output}`). None: read the
    /// shapes [`crate::meter::usage_of`] knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<String>,
    /// jq over the request's body as sent (without credentials): what a call is expected
    /// to cost, and at the most (a number, or `{input, output}`). None: the body's size and
    /// its `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<String>,
}

impl AnswerSpec {
    /// Nothing is checked or extracted: every 2xx body is stored as it is.
    pub fn is_plain(&self) -> bool {
        *self == AnswerSpec::default()
    }

    /// The differences between `self` (stored) and `other`, one human line each.
    pub fn changes(&self, other: &AnswerSpec) -> Vec<String> {
        let mut out = Vec::new();
        let show = |p: &Option<String>| p.as_deref().map_or("none".into(), |p| format!("{p:?}"));
        let mut cmp = |what: Setting, a: String, b: String| {
            if a != b {
                out.push(format!("{what}: stored {a}, given {b}"));
            }
        };
        let expect = |json| if json { "json" } else { "any" }.to_string();
        cmp(
            Setting::ExpectJson,
            expect(self.expect_json),
            expect(other.expect_json),
        );
        cmp(Setting::FailIf, show(&self.fail_if), show(&other.fail_if));
        cmp(
            Setting::RetryIf,
            show(&self.retry_if),
            show(&other.retry_if),
        );
        cmp(Setting::Extract, show(&self.extract), show(&other.extract));
        cmp(
            Setting::KeepBody,
            self.keep_body.to_string(),
            other.keep_body.to_string(),
        );
        out
    }
}

/// A program that is not jq.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {program:?} is not a valid jq program: {reason}")]
pub struct AnswerError {
    /// Which of the spec's programs.
    pub what: Setting,
    /// The program as written.
    pub program: String,
    /// The parser's or compiler's message.
    pub reason: String,
}

type Filter = jaq_core::Filter<data::JustLut<Val>>;

/// One compiled jq program and its source, for messages.
struct Program {
    source: String,
    filter: Filter,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Program({:?})", self.source)
    }
}

/// What a program made of one answer.
enum Run {
    Values(Vec<Val>),
    /// The program errored: jq's message.
    Error(String),
}

impl Program {
    fn compile(what: Setting, source: &str) -> Result<Program, AnswerError> {
        Program::compile_with(what, source, &["$status", "$headers"])
    }

    /// Compile `source` with `globals` bound (their values are given to [`Program::run`] in
    /// the same order).
    fn compile_with(what: Setting, source: &str, globals: &[&str]) -> Result<Program, AnswerError> {
        let refuse = |reason: String| AnswerError {
            what: what.clone(),
            program: source.to_string(),
            reason,
        };
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .filter(|(name, _, _)| !LEFT_OUT.contains(name));
        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: source,
                    path: (),
                },
            )
            .map_err(|errors| refuse(load_errors(source, errors)))?;
        let filter = Compiler::default()
            .with_funs(funs)
            .with_global_vars(globals.iter().copied())
            .compile(modules)
            .map_err(|errors| refuse(compile_errors(errors)))?;
        Ok(Program {
            source: source.to_string(),
            filter,
        })
    }

    /// Run on `input`, stopping at the first output that `enough` accepts.
    fn run(&self, input: Val, vars: &[Val], enough: impl Fn(&Val) -> bool) -> Run {
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new(vars.iter().cloned()));
        let mut values = Vec::new();
        for out in self.filter.id.run((ctx, input)) {
            match out {
                Ok(v) => {
                    let stop = enough(&v);
                    values.push(v);
                    if stop {
                        break;
                    }
                }
                Err(exn) => {
                    return Run::Error(match exn.get_err() {
                        Ok(e) => e.to_string(),
                        // `halt` is left out; this is only a backstop.
                        Err(_) => "the program stopped (halt)".to_string(),
                    });
                }
            }
        }
        Run::Values(values)
    }
}

fn load_errors(source: &str, errors: jaq_core::load::Errors<&str, ()>) -> String {
    use jaq_core::load::Error;
    let at = |rest: &str| {
        let offset = jaq_core::load::span(source, rest).start;
        if rest.is_empty() {
            "at the end".to_string()
        } else {
            format!("at character {}", source[..offset].chars().count() + 1)
        }
    };
    let mut out = Vec::new();
    for (_, error) in errors {
        match error {
            Error::Io(errs) => out.extend(errs.into_iter().map(|(p, e)| format!("{p}: {e}"))),
            Error::Lex(errs) => out.extend(
                errs.into_iter()
                    .map(|(expect, rest)| format!("expected {} {}", expect.as_str(), at(rest))),
            ),
            Error::Parse(errs) => out.extend(
                errs.into_iter()
                    .map(|(expect, rest)| format!("expected {} {}", expect.as_str(), at(rest))),
            ),
        }
    }
    out.join("; ")
}

fn compile_errors(errors: jaq_core::compile::Errors<&str, ()>) -> String {
    let mut out = Vec::new();
    for (_, errs) in errors {
        for (name, undefined) in errs {
            out.push(match undefined {
                jaq_core::compile::Undefined::Filter(arity) => {
                    format!("undefined filter {name}/{arity}")
                }
                other => format!("undefined {} {name}", other.as_str()),
            });
        }
    }
    out.join("; ")
}

/// A job's answer checks, compiled. Cheap to share.
#[derive(Debug, Default)]
pub struct Answer {
    expect_json: bool,
    fail_if: Option<Program>,
    retry_if: Option<Program>,
    extract: Option<Program>,
    keep_body: bool,
    usage: Option<Program>,
    estimate: Option<Program>,
    /// A usage or estimate program failed once already (said once, then quietly).
    meter_failed: std::sync::atomic::AtomicBool,
}

impl Answer {
    /// Compile `spec`'s programs; a malformed one is named with the parser's message.
    pub fn compile(spec: &AnswerSpec) -> Result<Answer, AnswerError> {
        let compile = |what: Setting, p: &Option<String>| {
            p.as_deref()
                .map(|source| Program::compile(what.clone(), source))
                .transpose()
        };
        Ok(Answer {
            expect_json: spec.expect_json,
            fail_if: compile(Setting::FailIf, &spec.fail_if)?,
            retry_if: compile(Setting::RetryIf, &spec.retry_if)?,
            extract: compile(Setting::Extract, &spec.extract)?,
            keep_body: spec.keep_body,
            usage: compile(Setting::Usage, &spec.usage)?,
            estimate: compile(Setting::Estimate, &spec.estimate)?,
            meter_failed: Default::default(),
        })
    }

    /// What the call of an answer (`body` as it came, before any extract) cost: by the
    /// job's usage program, with `$status` and `$headers` bound, or else as a language
    /// model's answer says ([`crate::meter::usage_of`]). A program that fails or gives no
    /// cost leaves it unknown (said once per run, as a warning).
    pub fn usage<'h, H>(
        &self,
        status: Option<u16>,
        headers: impl FnOnce() -> H,
        body: &[u8],
    ) -> Option<crate::meter::Usage>
    where
        H: Iterator<Item = (&'h str, &'h [u8])>,
    {
        let Some(program) = &self.usage else {
            return crate::meter::usage_of(body);
        };
        let vars = [
            status.map_or(Val::Null, |s| Val::from(s as isize)),
            headers_val(headers()),
        ];
        self.cost(Setting::Usage, program, body, &vars)
    }

    /// What a call whose request body is `sent` is expected to cost (and at the most), by
    /// the job's estimate program; none without one.
    pub fn estimate(&self, sent: &str) -> Option<crate::meter::Usage> {
        let program = self.estimate.as_ref()?;
        let vars = [Val::Null, headers_val(std::iter::empty())];
        self.cost(Setting::Estimate, program, sent.as_bytes(), &vars)
    }

    /// Whether the job estimates its calls with a program of its own.
    pub fn has_estimate(&self) -> bool {
        self.estimate.is_some()
    }

    /// `program`'s first output over `text` (JSON, or a string when it is not) as a cost.
    fn cost(
        &self,
        what: Setting,
        program: &Program,
        text: &[u8],
        vars: &[Val; 2],
    ) -> Option<crate::meter::Usage> {
        let text = text.trim_ascii();
        let input = match jaq_json::read::parse_single(text) {
            Ok(v) => v,
            Err(_) => Val::from(String::from_utf8_lossy(text).into_owned()),
        };
        let outcome = match program.run(input, vars, |_| true) {
            Run::Error(e) => Err(e),
            Run::Values(values) => match values.first() {
                None => Err("it gave no value".to_string()),
                Some(v) => serde_json::from_str::<serde_json::Value>(&v.to_string())
                    .map_err(|e| e.to_string())
                    .and_then(|v| crate::meter::Usage::from_json(&v)),
            },
        };
        match outcome {
            Ok(usage) => usage,
            Err(e) => {
                if !self
                    .meter_failed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(
                        "{what} {:?} failed ({e}): that call's cost is not counted (said once)",
                        program.source
                    );
                }
                None
            }
        }
    }

    fn has_programs(&self) -> bool {
        self.fail_if.is_some() || self.retry_if.is_some() || self.extract.is_some()
    }

    /// Judge one answer (a 2xx answer, or the output of a process that exited 0): the
    /// result to store, or why the attempt failed.
    ///
    /// `status` is the HTTP status (`$status`; null without one, as for an exec job's
    /// output), kept in a failure. `headers` is only called when a program runs (building
    /// `$headers` costs).
    pub fn judge<'h, H>(
        &self,
        status: Option<u16>,
        headers: impl FnOnce() -> H,
        body: Vec<u8>,
    ) -> Result<Box<RawValue>, Failure>
    where
        H: Iterator<Item = (&'h str, &'h [u8])>,
    {
        if !self.expect_json && !self.has_programs() {
            return Ok(body_as_json(body));
        }
        let text = body.trim_ascii();
        let json = serde_json::from_slice::<serde::de::IgnoredAny>(text).map_err(|e| e.to_string());
        let refuse = |class, next, message: String| Failure {
            next,
            class,
            status,
            message,
        };
        if let (true, Err(e)) = (self.expect_json, &json) {
            let why = if text.is_empty() {
                "the body is empty".to_string()
            } else {
                format!("the body is not JSON ({e}): {}", snippet(text))
            };
            return Err(refuse(
                ErrorClass::Body,
                Next::Retry { after: None },
                format!("expect json: {why}"),
            ));
        }
        if !self.has_programs() {
            return Ok(body_as_json(body));
        }
        let input = match json {
            Ok(_) => jaq_json::read::parse_single(text).map_err(|e| {
                refuse(
                    ErrorClass::Invalid,
                    Next::Permanent,
                    format!(
                        "the body cannot be read as jq input ({e}): {}",
                        snippet(text)
                    ),
                )
            })?,
            Err(_) => Val::from(String::from_utf8_lossy(&body).into_owned()),
        };
        let vars = [
            status.map_or(Val::Null, |s| Val::from(s as isize)),
            headers_val(headers()),
        ];
        self.judge_input(input, &vars, status, body)
    }

    /// The checks and the extract on an answer read as `input` (`body` as it came, for
    /// messages and to store).
    fn judge_input(
        &self,
        input: Val,
        vars: &[Val; 2],
        status: Option<u16>,
        body: Vec<u8>,
    ) -> Result<Box<RawValue>, Failure> {
        let text = body.trim_ascii();
        let refuse = |class, next, message: String| Failure {
            next,
            class,
            status,
            message,
        };
        let failed = |name: &str, program: &Program, error: String| {
            refuse(
                ErrorClass::Invalid,
                Next::Permanent,
                format!("{name} {:?} failed on the answer: {error}", program.source),
            )
        };
        for (name, program, verdict) in [
            ("fail-if", &self.fail_if, Next::Permanent),
            ("retry-if", &self.retry_if, Next::Retry { after: None }),
        ] {
            let Some(program) = program else { continue };
            match program.run(input.clone(), vars, truthy) {
                Run::Error(e) => return Err(failed(name, program, e)),
                Run::Values(values) if values.iter().any(truthy) => {
                    return Err(refuse(
                        ErrorClass::Invalid,
                        verdict,
                        format!("{name} {:?} is true: {}", program.source, snippet(text)),
                    ))
                }
                Run::Values(_) => {}
            }
        }
        let Some(program) = &self.extract else {
            return Ok(body_as_json(body));
        };
        let value = match program.run(input, vars, |_| false) {
            Run::Error(e) => return Err(failed("extract", program, e)),
            Run::Values(mut values) if values.len() == 1 => values.pop().expect("one value"),
            Run::Values(values) => {
                return Err(failed(
                    "extract",
                    program,
                    format!(
                        "it gave {} values, not one (collect several with [...])",
                        values.len()
                    ),
                ))
            }
        };
        let extracted = RawValue::from_string(value.to_string()).map_err(|_| {
            failed(
                "extract",
                program,
                format!(
                    "its output is not JSON: {}",
                    snippet(value.to_string().as_bytes())
                ),
            )
        })?;
        if !self.keep_body {
            return Ok(extracted);
        }
        let raw = body_as_json(body);
        Ok(serde_json::value::to_raw_value(&serde_json::json!({
            "extract": &*extracted,
            "raw": &*raw,
        }))
        .expect("raw values serialize"))
    }
}

/// A batch answer's split: a jq program whose outputs are `{key, value}` objects, one per
/// ID the answer holds (`key` the ID, a string or a number; `value` that ID's answer).
#[derive(Debug)]
pub struct Splitter(Program);

impl Splitter {
    /// Compile a split program (`--split`); a program that is not jq is an [`AnswerError`].
    pub fn compile(source: &str) -> Result<Splitter, AnswerError> {
        Program::compile(Setting::Split, source).map(Splitter)
    }
}

/// Each ID's part of a batch answer: its result, or why its attempt failed.
pub type Parts = Vec<(String, Result<Box<RawValue>, Failure>)>;

impl Answer {
    /// Split a batch's 2xx answer with `splitter` and judge each ID's value with the checks
    /// ([`Answer::judge`]'s order, the value in place of the body). An answer that is not
    /// JSON is a retryable failure of the whole batch (class `body`); a split that errors or
    /// gives something other than `{key, value}` objects fails the whole batch for good
    /// (class `invalid`). IDs the answer does not mention are not in the parts.
    pub fn split<'h, H>(
        &self,
        splitter: &Splitter,
        status: Option<u16>,
        headers: impl FnOnce() -> H,
        body: &[u8],
    ) -> Result<Parts, Failure>
    where
        H: Iterator<Item = (&'h str, &'h [u8])>,
    {
        let text = body.trim_ascii();
        let refuse = |class, next, message: String| Failure {
            next,
            class,
            status,
            message,
        };
        let input = jaq_json::read::parse_single(text).map_err(|e| {
            refuse(
                ErrorClass::Body,
                Next::Retry { after: None },
                format!("a batch answer must be JSON ({e}): {}", snippet(text)),
            )
        })?;
        let vars = [
            status.map_or(Val::Null, |s| Val::from(s as isize)),
            headers_val(headers()),
        ];
        let program = &splitter.0;
        let invalid = |why: String| {
            refuse(
                ErrorClass::Invalid,
                Next::Permanent,
                format!("{} {:?} {why}", Setting::Split, program.source),
            )
        };
        let values = match program.run(input, &vars, |_| false) {
            Run::Error(e) => return Err(invalid(format!("failed on the answer: {e}"))),
            Run::Values(values) => values,
        };
        let key = Val::from("key".to_string());
        let value_key = Val::from("value".to_string());
        let mut parts = Vec::with_capacity(values.len());
        for v in values {
            let Val::Obj(object) = &v else {
                return Err(invalid(format!(
                    "gave {}, not a {{key, value}} object",
                    snippet(v.to_string().as_bytes())
                )));
            };
            let id = match object.get(&key) {
                Some(k @ (Val::TStr(_) | Val::BStr(_))) => {
                    String::from_utf8_lossy(&val_text(k)).into_owned()
                }
                Some(k @ Val::Num(_)) => k.to_string(),
                _ => {
                    return Err(invalid(format!(
                        "gave {}, whose key is not a string or a number",
                        snippet(v.to_string().as_bytes())
                    )))
                }
            };
            let value = object.get(&value_key).cloned().unwrap_or(Val::Null);
            let value_text = value.to_string();
            let result = if self.has_programs() {
                self.judge_input(value, &vars, status, value_text.into_bytes())
            } else {
                Ok(body_as_json(value_text.into_bytes()))
            };
            parts.push((id, result));
        }
        Ok(parts)
    }
}

/// A jq program of a paginated job (what is kept of a page, or where the next page is),
/// run over a page's body parsed as JSON with `$status`, `$headers`, `$page` (the page's
/// number, from 0) and `$count` (the items kept of the page; null for the items program)
/// bound.
#[derive(Debug)]
pub(crate) struct PageProgram(Program);

/// What a page's programs see beside its body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageVars<'a> {
    /// The page's HTTP status.
    pub(crate) status: u16,
    /// The page's headers, as received.
    pub(crate) headers: &'a [(&'a str, &'a [u8])],
    /// The page's number, from 0.
    pub(crate) page: u32,
    /// The items kept of the page (none while they are being counted).
    pub(crate) count: Option<u32>,
}

impl PageProgram {
    /// Compile `source`, the program of the setting `what`.
    pub(crate) fn compile(what: Setting, source: &str) -> Result<PageProgram, AnswerError> {
        Program::compile_with(what, source, &["$status", "$headers", "$page", "$count"])
            .map(PageProgram)
    }

    /// The program as written.
    pub(crate) fn source(&self) -> &str {
        &self.0.source
    }

    /// Every output of the program on `body`, or jq's message when it errors.
    pub(crate) fn outputs(
        &self,
        body: &serde_json::Value,
        vars: PageVars<'_>,
    ) -> Result<Vec<serde_json::Value>, String> {
        let input = jaq_json::read::parse_single(body.to_string().as_bytes())
            .map_err(|e| format!("the page is not JSON: {e}"))?;
        let vars = [
            Val::from(vars.status as isize),
            headers_val(vars.headers.iter().copied()),
            Val::from(vars.page as isize),
            vars.count.map_or(Val::Null, |c| Val::from(c as isize)),
        ];
        match self.0.run(input, &vars, |_| false) {
            Run::Error(e) => Err(e),
            Run::Values(values) => values
                .into_iter()
                .map(|v| {
                    let text = v.to_string();
                    serde_json::from_str(&text).map_err(|_| {
                        format!("gave {}, which is not JSON", snippet(text.as_bytes()))
                    })
                })
                .collect(),
        }
    }
}

fn truthy(v: &Val) -> bool {
    jaq_core::ValT::as_bool(v)
}

fn headers_val<'h>(headers: impl Iterator<Item = (&'h str, &'h [u8])>) -> Val {
    let mut map = jaq_json::Map::default();
    for (name, value) in headers {
        let key = Val::from(name.to_ascii_lowercase());
        let value = String::from_utf8_lossy(value).into_owned();
        let joined = match map.get(&key) {
            Some(prior) => format!("{}, {value}", String::from_utf8_lossy(&val_text(prior))),
            None => value,
        };
        map.insert(key, Val::from(joined));
    }
    Val::obj(map)
}

/// The text of a string value as it was inserted.
fn val_text(v: &Val) -> Vec<u8> {
    match v {
        Val::TStr(b) | Val::BStr(b) => b.to_vec(),
        other => other.to_string().into_bytes(),
    }
}

/// The start of an answer, on one line, for messages.
fn snippet(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = one_line.chars().take(SNIPPET_CHARS).collect();
    if out.len() < one_line.len() {
        out.push('…');
    }
    out
}

/// The answer body as one-line JSON: itself when it is JSON, otherwise a JSON string of it.
pub fn body_as_json(bytes: Vec<u8>) -> Box<RawValue> {
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    let trimmed = text.trim();
    if let Ok(value) = serde_json::from_str::<&RawValue>(trimmed) {
        if !trimmed.contains(['\n', '\r']) {
            return value.to_owned();
        }
        if let Ok(parsed) = serde_json::from_str::<serde_json::Value>(trimmed) {
            return serde_json::value::to_raw_value(&parsed).expect("a Value always serializes");
        }
    }
    serde_json::value::to_raw_value(&text).expect("a string always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(spec: AnswerSpec) -> Answer {
        Answer::compile(&spec).unwrap()
    }

    fn judge(a: &Answer, body: &str) -> Result<String, Failure> {
        let headers = [("Content-Type", b"application/json".as_slice())];
        a.judge(
            Some(200),
            || headers.iter().copied(),
            body.as_bytes().to_vec(),
        )
        .map(|v| v.get().to_string())
    }

    fn spec() -> AnswerSpec {
        AnswerSpec {
            expect_json: true,
            fail_if: Some(".error != null".into()),
            retry_if: Some(r#".status == "pending""#.into()),
            ..AnswerSpec::default()
        }
    }

    #[test]
    fn a_batch_answer_is_split_by_key_and_each_part_judged() {
        let split = |a: &Answer, program: &str, body: &str| {
            let headers: [(&str, &[u8]); 0] = [];
            a.split(
                &Splitter::compile(program).unwrap(),
                Some(200),
                || headers.iter().copied(),
                body.as_bytes(),
            )
        };
        let body = r#"{"results":[{"id":"b","v":{"ok":1}},{"id":7,"v":{"error":"x"}},{"id":"c","v":{"status":"pending"}}]}"#;
        let a = answer(spec());
        let parts = split(&a, ".results[] | {key: .id, value: .v}", body).unwrap();
        let ids: Vec<&str> = parts.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(ids, ["b", "7", "c"], "keys as text, numbers in decimal");
        assert_eq!(parts[0].1.as_ref().unwrap().get(), r#"{"ok":1}"#);
        let failed = parts[1].1.as_ref().unwrap_err();
        assert_eq!(
            (failed.next, failed.class),
            (Next::Permanent, ErrorClass::Invalid)
        );
        assert!(parts[2]
            .1
            .as_ref()
            .unwrap_err()
            .next
            .retry_after()
            .is_some());
        // Without checks a part is stored as it is.
        let plain = answer(AnswerSpec::default());
        let parts = split(&plain, ".results[] | {key: .id, value: .v}", body).unwrap();
        assert_eq!(parts[1].1.as_ref().unwrap().get(), r#"{"error":"x"}"#);
        // A split that does not give {key, value} objects, or errors, fails the whole batch
        // for good; an answer that is not JSON is retried.
        for program in [
            ".results[]",
            ".results[] | {key: .v, value: .}",
            ".nope.deeper[]",
        ] {
            let e = split(&plain, program, body).unwrap_err();
            assert_eq!(
                (e.next, e.class),
                (Next::Permanent, ErrorClass::Invalid),
                "{program}: {e:?}"
            );
            assert!(
                e.message.contains("--split") || e.message.contains("split"),
                "{}",
                e.message
            );
        }
        let e = split(&plain, ".[]", "<html>").unwrap_err();
        assert_eq!(e.class, ErrorClass::Body);
        assert!(e.next.retry_after().is_some());
    }

    #[test]
    fn plain_answers_are_stored_as_they_are() {
        let a = answer(AnswerSpec::default());
        assert_eq!(judge(&a, "<html>").unwrap(), r#""<html>""#);
        assert_eq!(judge(&a, r#"{"a": 1}"#).unwrap(), r#"{"a": 1}"#);
    }

    #[test]
    fn checks_come_in_order_and_say_which_matched() {
        let a = answer(spec());
        assert_eq!(judge(&a, r#"{"v":1}"#).unwrap(), r#"{"v":1}"#);
        for (body, class, verdict, says) in [
            (
                "<html>oops</html>",
                ErrorClass::Body,
                Next::Retry { after: None },
                "expect json",
            ),
            (
                r#"{"v":"#,
                ErrorClass::Body,
                Next::Retry { after: None },
                "expect json",
            ),
            ("  ", ErrorClass::Body, Next::Retry { after: None }, "empty"),
            (
                r#"{"error":"quota","status":"pending"}"#,
                ErrorClass::Invalid,
                Next::Permanent,
                "fail-if",
            ),
            (
                r#"{"status":"pending"}"#,
                ErrorClass::Invalid,
                Next::Retry { after: None },
                "retry-if",
            ),
        ] {
            let e = judge(&a, body).unwrap_err();
            assert_eq!((e.class, e.next), (class, verdict), "{body}: {e:?}");
            assert!(e.message.contains(says), "{body}: {}", e.message);
            assert_eq!(e.status, Some(200));
        }
        let e = judge(&a, r#"{"error":"quota exceeded"}"#).unwrap_err();
        assert!(e.message.contains(r#"".error != null""#), "{}", e.message);
        assert!(e.message.contains("quota exceeded"), "{}", e.message);
    }

    #[test]
    fn a_program_that_errors_fails_the_id_with_jqs_message() {
        let a = answer(AnswerSpec {
            fail_if: Some(".a.b == 1".into()),
            ..AnswerSpec::default()
        });
        let e = judge(&a, r#"{"a":"text"}"#).unwrap_err();
        assert_eq!(e.class, ErrorClass::Invalid);
        assert_eq!(e.next, Next::Permanent);
        assert!(e.message.contains("cannot index"), "{}", e.message);
        // Not JSON and no --expect json: the program sees the body as a string.
        let e = judge(&a, "plain").unwrap_err();
        assert!(e.message.contains("cannot index"), "{}", e.message);
        let halt = answer(AnswerSpec {
            extract: Some("halt".into()),
            ..AnswerSpec::default()
        });
        let e = judge(&halt, "1").unwrap_err();
        assert_eq!(e.next, Next::Permanent);
        assert!(e.message.contains("halt"), "{}", e.message);
    }

    #[test]
    fn status_and_headers_are_bound() {
        let a = answer(AnswerSpec {
            fail_if: Some(
                r#"$status != 200 or $headers["content-type"] != "application/json""#.into(),
            ),
            ..AnswerSpec::default()
        });
        assert!(judge(&a, "1").is_ok());
        let headers = [
            ("content-type", b"text/html".as_slice()),
            ("x-a", b"1".as_slice()),
            ("x-a", b"2".as_slice()),
        ];
        let e = a
            .judge(Some(200), || headers.iter().copied(), b"1".to_vec())
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Invalid);
        let a = answer(AnswerSpec {
            extract: Some(r#"{s: $status, a: $headers["x-a"]}"#.into()),
            ..AnswerSpec::default()
        });
        let out = a
            .judge(Some(201), || headers.iter().copied(), b"1".to_vec())
            .unwrap();
        assert_eq!(out.get(), r#"{"s":201,"a":"1, 2"}"#);
        // An exec job's output: no status, no headers.
        let out = a.judge(None, std::iter::empty, b"1".to_vec()).unwrap();
        assert_eq!(out.get(), r#"{"s":null,"a":null}"#);
    }

    #[test]
    fn extract_keeps_its_one_output_and_the_body_if_asked() {
        let mut s = AnswerSpec {
            extract: Some("{name: .data.name, score: .data.score}".into()),
            ..AnswerSpec::default()
        };
        let body = r#"{"data":{"name":"x","score":0.5,"blob":"long"}}"#;
        assert_eq!(
            judge(&answer(s.clone()), body).unwrap(),
            r#"{"name":"x","score":0.5}"#
        );
        s.keep_body = true;
        let kept: serde_json::Value =
            serde_json::from_str(&judge(&answer(s), body).unwrap()).unwrap();
        assert_eq!(kept["extract"]["name"], "x");
        assert_eq!(kept["raw"]["data"]["blob"], "long");
        let many = answer(AnswerSpec {
            extract: Some(".[]".into()),
            ..AnswerSpec::default()
        });
        let e = judge(&many, "[1,2]").unwrap_err();
        assert!(e.message.contains("2 values"), "{}", e.message);
        assert!(judge(&many, "[]").is_err());
        assert_eq!(judge(&many, "[3]").unwrap(), "3");
    }

    #[test]
    fn malformed_programs_are_refused_with_the_parsers_message() {
        for (program, says) in [
            (".a +", "expected"),
            ("{a: .x", "expected"),
            ("$nope", "undefined variable $nope"),
            ("nosuch(1)", "undefined filter nosuch/1"),
            ("env.TOKEN", "undefined filter env/0"),
            ("$ENV.TOKEN", "undefined variable $ENV"),
        ] {
            let e = Answer::compile(&AnswerSpec {
                retry_if: Some(program.into()),
                ..AnswerSpec::default()
            })
            .unwrap_err();
            assert_eq!(e.what, Setting::RetryIf);
            assert!(e.to_string().contains(says), "{program}: {e}");
        }
    }

    #[test]
    fn specs_without_answer_checks_are_plain() {
        let spec: AnswerSpec = serde_json::from_str("{}").unwrap();
        assert!(spec.is_plain());
        assert_eq!(serde_json::to_string(&spec).unwrap(), "{}");
    }

    #[test]
    fn bodies_become_one_line_json() {
        assert_eq!(body_as_json(b"{\"a\": 1}".to_vec()).get(), "{\"a\": 1}");
        assert_eq!(
            body_as_json(b"{\n  \"a\": 1\n}\n".to_vec()).get(),
            "{\"a\":1}"
        );
        assert_eq!(body_as_json(b"plain text".to_vec()).get(), "\"plain text\"");
        assert_eq!(body_as_json(b"\xff".to_vec()).get(), "\"\u{fffd}\"");
        assert_eq!(body_as_json(Vec::new()).get(), "\"\"");
    }
}
