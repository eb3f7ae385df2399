//! Templates: text with `{id}` slots, `{column}` slots for the input row's columns, `${VAR}`
//! expanded from the environment and `${NAME}` slots for the job's credentials.
//!
//! A template is parsed once, when a handler is built: `${VAR}` is replaced by the
//! variable's value then (so a value is never itself a template, and an ID is never
//! expanded), and `{id}` is written for where it stands ([`IdEncoding`]). A `${NAME}` that
//! names one of the job's credentials is not looked up in the environment: it stays a slot,
//! written with the credential's current value for each request ([`Template::render_with`]),
//! as is (a token is text that needs no encoding). The HTTP handler's URL, headers and body
//! and the exec handler's arguments are templates.
//!
//! A `{name}` whose name is a column name (ASCII letters, digits, `_`, `-`, `.`, not starting
//! with a digit; `id` is the ID) is a slot for the value of that column of the row the ID came
//! from, written for where it stands as `{id}` is: a string as its text, any other JSON value
//! (a number, a JSON line's object) as its JSON text. `{name:json}` writes the value as JSON
//! (a string with its quotes), for a body that wants the value itself. `{{` is a literal `{`.
//! Any other `{` is text, so JSON bodies need no escaping.
//!
//! A batch request (several IDs per call, [`super::batch`]) has `{ids}`: in the URL or a
//! header the IDs joined by the batch's separator, each encoded for where it stands; in the
//! body a JSON array of the IDs. `{rows}` in the body is a JSON array of one object per ID:
//! `{"id": ..., column: value, ...}` with the kept columns of its row.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::error::HandlerError;
use crate::failure::{ErrorClass, Failure};
use crate::setting::Setting;

/// Everything but RFC 3986 unreserved characters is encoded: safe in a path segment (where
/// `/` must be encoded) and in a query value (where `&`, `=`, `+`, `#` must be).
const ID_IN_URL: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How `{id}` is written where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdEncoding {
    /// Percent-encoded (URL path segment or query value).
    Url,
    /// JSON string content, without the quotes.
    Json,
    /// As is (header values).
    Raw,
}

#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    Id,
    /// The value of the job's credential of this index.
    Credential(usize),
    /// The value of the input row's column `name`; as JSON with `json`.
    Column {
        name: String,
        json: bool,
    },
    /// A batch's IDs.
    Ids,
    /// A batch's rows, as JSON objects.
    Rows,
}

/// A template with `${VAR}` already expanded: text and `{id}` slots.
#[derive(Clone)]
pub(crate) struct Template {
    pub(crate) pieces: Vec<Piece>,
    encoding: IdEncoding,
}

impl Template {
    /// Parse `source`, expanding `${VAR}` with `env`. `what` names the setting for messages.
    #[cfg(test)]
    pub(crate) fn parse(
        source: &str,
        what: &Setting,
        encoding: IdEncoding,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Template, HandlerError> {
        Self::parse_with(source, what, encoding, env, &[])
    }

    /// [`Template::parse`], where a `${NAME}` of `credentials` is a slot for that
    /// credential's value (by its index), not an environment variable.
    pub(crate) fn parse_with(
        source: &str,
        what: &Setting,
        encoding: IdEncoding,
        env: &dyn Fn(&str) -> Option<String>,
        credentials: &[&str],
    ) -> Result<Template, HandlerError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = source;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{id}") {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Id);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("{ids}") {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Ids);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("{rows}") {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(Piece::Rows);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("{{") {
                text.push('{');
                rest = after;
            } else if let Some((column, after)) = column_slot(rest) {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
                pieces.push(column);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("${") {
                let credential = after.find('}').and_then(|end| {
                    let at = credentials.iter().position(|c| *c == &after[..end])?;
                    Some((at, &after[end + 1..]))
                });
                if let Some((at, after)) = credential {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                    pieces.push(Piece::Credential(at));
                    rest = after;
                    continue;
                }
                let (value, after) = expand_var(after, what, env)?;
                text.push_str(&value);
                rest = after;
            } else {
                let c = rest.chars().next().expect("rest is not empty");
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        pieces.push(Piece::Text(text));
        pieces.retain(|p| p != &Piece::Text(String::new()));
        Ok(Template { pieces, encoding })
    }

    pub(crate) fn has_id(&self) -> bool {
        self.pieces.contains(&Piece::Id)
    }

    /// Whether a batch's `{ids}` or `{rows}` stands in it.
    pub(crate) fn has_ids(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Ids | Piece::Rows))
    }

    /// Whether a single ID's `{id}` or `{column}` stands in it.
    pub(crate) fn has_single(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Id | Piece::Column { .. }))
    }

    /// The input columns its `{column}` slots name, in order of appearance (repeats kept).
    pub(crate) fn columns(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Column { name, .. } => Some(name.as_str()),
            _ => None,
        })
    }

    /// Whether a credential's value stands in it.
    pub(crate) fn has_credential(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Credential(_)))
    }

    /// Whether some `{id}` of this URL template is a whole path segment (`/items/{id}/x`),
    /// where the IDs `.` and `..` would be resolved away by URL normalisation.
    pub(crate) fn id_is_path_segment(&self) -> bool {
        let mut in_path = true;
        for (i, piece) in self.pieces.iter().enumerate() {
            match piece {
                Piece::Text(t) if t.contains(['?', '#']) => in_path = false,
                Piece::Id if in_path => {
                    let before = i.checked_sub(1).map(|j| &self.pieces[j]);
                    let after = self.pieces.get(i + 1);
                    let starts = matches!(before, Some(Piece::Text(t)) if t.ends_with('/'));
                    let ends = match after {
                        None => true,
                        Some(Piece::Text(t)) => t.starts_with(['/', '?', '#']),
                        Some(_) => false,
                    };
                    if starts && ends {
                        return true;
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// The text for `id`, a credential written as the placeholder `credential` (to check
    /// what a template makes without the values).
    pub(crate) fn render(&self, id: &str) -> String {
        self.render_with(id, &[])
    }

    /// The text for `id`, with `credentials[i]` for the credential of index `i` (the
    /// placeholder `credential` for one not given) and a column's name for its value.
    pub(crate) fn render_with(&self, id: &str, credentials: &[&str]) -> String {
        self.render_row(id, None, credentials)
    }

    /// [`Template::render_with`], with the values of the input row's columns (a column not in
    /// `row` is written as its name: only a check of what the template makes lacks them).
    pub(crate) fn render_row(
        &self,
        id: &str,
        row: Option<&RowValues>,
        credentials: &[&str],
    ) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Credential(i) => out.push_str(credentials.get(*i).unwrap_or(&"credential")),
                Piece::Id => self.write(&mut out, id),
                Piece::Column { name, json } => match (row.and_then(|r| r.get(name)), json) {
                    (None, _) => self.write(&mut out, name),
                    (Some(serde_json::Value::String(s)), false) => self.write(&mut out, s),
                    // JSON in a JSON body is the value itself, not a string's content.
                    (Some(value), true) if self.encoding == IdEncoding::Json => {
                        out.push_str(&value.to_string())
                    }
                    (Some(value), _) => self.write(&mut out, &value.to_string()),
                },
                Piece::Ids | Piece::Rows => self.write(&mut out, id),
            }
        }
        out
    }

    /// The text for a batch of `items` (each ID with its row's kept columns): `{ids}` and
    /// `{rows}` as the module doc says, IDs in the URL or a header joined by `separator`.
    pub(crate) fn render_batch(
        &self,
        items: &[(&str, Option<&RowValues>)],
        separator: &str,
        credentials: &[&str],
    ) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Credential(i) => out.push_str(credentials.get(*i).unwrap_or(&"credential")),
                Piece::Ids if self.encoding == IdEncoding::Json => {
                    let ids: Vec<&str> = items.iter().map(|(id, _)| *id).collect();
                    out.push_str(&serde_json::to_string(&ids).expect("strings serialize"));
                }
                Piece::Ids => {
                    for (i, (id, _)) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(separator);
                        }
                        self.write(&mut out, id);
                    }
                }
                Piece::Rows => {
                    let rows: Vec<serde_json::Value> = items
                        .iter()
                        .map(|(id, row)| {
                            let mut object = row.cloned().unwrap_or_default();
                            object.insert("id".into(), (*id).into());
                            serde_json::Value::Object(object)
                        })
                        .collect();
                    let text = serde_json::to_string(&rows).expect("values serialize");
                    match self.encoding {
                        IdEncoding::Json => out.push_str(&text),
                        _ => self.write(&mut out, &text),
                    }
                }
                // Refused in a batch job's templates before it is created.
                Piece::Id | Piece::Column { .. } => {}
            }
        }
        out
    }

    /// Write a value for where the template's slots stand.
    fn write(&self, out: &mut String, value: &str) {
        match self.encoding {
            IdEncoding::Url => out.extend(utf8_percent_encode(value, ID_IN_URL)),
            IdEncoding::Raw => out.push_str(value),
            IdEncoding::Json => {
                let quoted = serde_json::to_string(value).expect("a string always serializes");
                out.push_str(&quoted[1..quoted.len() - 1]);
            }
        }
    }
}

/// An input row's column values, by column name (parsed from [`crate::input::Row::values`]).
pub(crate) type RowValues = serde_json::Map<String, serde_json::Value>;

/// The input columns `source`'s `{column}` slots name, in order of first appearance (a
/// `${VAR}` is not looked up: this reads the template as written).
pub(crate) fn columns_in(source: &str, out: &mut Vec<String>) {
    let any = |_: &str| Some(String::new());
    if let Ok(t) = Template::parse_with(source, &Setting::Url, IdEncoding::Raw, &any, &[]) {
        for name in t.columns() {
            if !out.iter().any(|c| c == name) {
                out.push(name.to_owned());
            }
        }
    }
}

/// Parse an item's kept columns (the JSON object its plan stored) for rendering; a value
/// that is not one fails the item, never the run (the store's record was damaged).
pub(crate) fn row_values(text: Option<&str>) -> Result<Option<RowValues>, Failure> {
    text.map(|t| {
        serde_json::from_str::<RowValues>(t).map_err(|e| {
            Failure::permanent(format!(
                "the row's stored column values are unreadable: {e}"
            ))
            .class(ErrorClass::Request)
        })
    })
    .transpose()
}

/// A `{name}` or `{name:json}` slot at the start of `text` (see the module doc), and the text
/// after it.
fn column_slot(text: &str) -> Option<(Piece, &str)> {
    let inner = text.strip_prefix('{')?;
    let end = inner.find('}')?;
    let (name, json) = match inner[..end].strip_suffix(":json") {
        Some(name) => (name, true),
        None => (&inner[..end], false),
    };
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (valid && name != "id").then(|| {
        (
            Piece::Column {
                name: name.to_owned(),
                json,
            },
            &inner[end + 1..],
        )
    })
}

/// Expand one `${NAME}`: `after` is the text after `${`. Returns the value and the text
/// after the closing `}`. `what` names the setting for messages (never the value).
fn expand_var<'a>(
    after: &'a str,
    what: &Setting,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, &'a str), HandlerError> {
    let end = after.find('}').ok_or_else(|| HandlerError::Invalid {
        what: what.clone(),
        reason: "unclosed ${ (write ${NAME})".into(),
    })?;
    let name = &after[..end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(HandlerError::Invalid {
            what: what.clone(),
            reason: format!("invalid variable name ${{{name}}}"),
        });
    }
    let value = env(name).ok_or_else(|| HandlerError::MissingVar {
        what: what.clone(),
        name: name.into(),
    })?;
    Ok((value, &after[end + 1..]))
}

/// Expand every `${NAME}` of `source` with `env`, as the templates do (for settings that
/// are not templates, such as a database URL). Errors name `what` and the variable only.
pub fn expand_env(
    source: &str,
    what: &Setting,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, HandlerError> {
    let mut out = String::new();
    let mut rest = source;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let (value, after) = expand_var(&rest[at + 2..], what, env)?;
        out.push_str(&value);
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(source: &str, encoding: IdEncoding) -> Template {
        Template::parse_with(source, &Setting::Body, encoding, &|_| Some("V".into()), &[]).unwrap()
    }

    fn row(json: &str) -> RowValues {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn column_slots_are_written_for_where_they_stand() {
        let r = row(r#"{"name":"Smith, \"J\" & Co/é?","n":7,"geo":{"lat":1.5}}"#);
        let url = parse("https://x/{id}?q={name}&n={n}&g={geo}", IdEncoding::Url);
        assert_eq!(
            url.render_row("a b", Some(&r), &[]),
            "https://x/a%20b?q=Smith%2C%20%22J%22%20%26%20Co%2F%C3%A9%3F&n=7\
             &g=%7B%22lat%22%3A1.5%7D"
        );
        let body = parse(
            r#"{"q":"{name}","n":{n:json},"geo":{geo:json},"as_text":"{geo}","raw":{name:json}}"#,
            IdEncoding::Json,
        );
        let sent: serde_json::Value =
            serde_json::from_str(&body.render_row("i", Some(&r), &[])).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({
                "q": "Smith, \"J\" & Co/é?",
                "n": 7,
                "geo": {"lat": 1.5},
                "as_text": "{\"lat\":1.5}",
                "raw": "Smith, \"J\" & Co/é?",
            })
        );
        let header = parse("Bearer ${TOKEN} for {name}", IdEncoding::Raw);
        assert_eq!(
            header.render_row("i", Some(&r), &[]),
            "Bearer V for Smith, \"J\" & Co/é?"
        );
        assert_eq!(
            header.columns().collect::<Vec<_>>(),
            ["name"],
            "a ${{VAR}} is not a column"
        );
    }

    #[test]
    fn only_names_make_slots_and_double_braces_escape() {
        let t = parse(
            r#"{"a":{"b":1}} { name } {} {1x} {{name}} {id} {x-y.z} {a:json} {b:yaml}"#,
            IdEncoding::Raw,
        );
        assert_eq!(t.columns().collect::<Vec<_>>(), ["x-y.z", "a"]);
        let r = row(r#"{"x-y.z":"X","a":[1]}"#);
        assert_eq!(
            t.render_row("I", Some(&r), &[]),
            r#"{"a":{"b":1}} { name } {} {1x} {name}} I X [1] {b:yaml}"#
        );
        let mut out = Vec::new();
        columns_in("{b}/{a}/{b}/${VAR}/{id}", &mut out);
        assert_eq!(out, ["b", "a"], "in order of first appearance, once");
    }

    #[test]
    fn a_batch_writes_its_ids_for_where_they_stand() {
        let r = row(r#"{"name":"N, é"}"#);
        let items = [("a/b", Some(&r)), ("c d", None)];
        let url = parse("https://x/users?ids={ids}&n=2", IdEncoding::Url);
        assert!(url.has_ids() && !url.has_single());
        assert_eq!(
            url.render_batch(&items, ",", &[]),
            "https://x/users?ids=a%2Fb,c%20d&n=2"
        );
        let header = parse("{ids}", IdEncoding::Raw);
        assert_eq!(header.render_batch(&items, "|", &[]), "a/b|c d");
        let body = parse(r#"{"ids":{ids},"rows":{rows}}"#, IdEncoding::Json);
        let sent: serde_json::Value =
            serde_json::from_str(&body.render_batch(&items, ",", &[])).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({
                "ids": ["a/b", "c d"],
                "rows": [{"id": "a/b", "name": "N, é"}, {"id": "c d"}],
            })
        );
        assert!(parse("{id}", IdEncoding::Raw).has_single());
        assert!(parse("{name}", IdEncoding::Raw).has_single());
    }

    #[test]
    fn stored_values_that_are_not_an_object_fail_the_item() {
        assert!(row_values(None).unwrap().is_none());
        assert_eq!(row_values(Some(r#"{"a":1}"#)).unwrap().unwrap()["a"], 1);
        let f = row_values(Some("[1]")).unwrap_err();
        assert_eq!(f.class, ErrorClass::Request);
    }
}
