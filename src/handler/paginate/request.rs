//! The changes a next request makes to the first request: query parameters replaced in its
//! URL ([`set_query`]), fields set in its JSON body ([`set_body_path`]).

use reqwest::Url;
use serde_json::Value;

/// `url` with the query parameters `pairs` set: each replaces every parameter of its name
/// already there (in place of the first of them), or is added at the end.
pub fn set_query(url: &Url, pairs: &[(String, String)]) -> Url {
    let old: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut done = vec![false; pairs.len()];
    let mut out = url.clone();
    {
        let mut query = out.query_pairs_mut();
        query.clear();
        for (name, value) in &old {
            match pairs.iter().position(|(n, _)| n == name) {
                Some(i) if done[i] => {}
                Some(i) => {
                    done[i] = true;
                    query.append_pair(name, &pairs[i].1);
                }
                None => {
                    query.append_pair(name, value);
                }
            }
        }
        for (i, (name, value)) in pairs.iter().enumerate() {
            if !done[i] {
                query.append_pair(name, value);
            }
        }
    }
    out
}

/// `body` with `value` set at the dotted `path`, objects made on the way (a part of the path
/// that holds something other than an object is replaced by one).
pub fn set_body_path(body: &mut Value, path: &str, value: Value) {
    let mut at = body;
    for part in path.split('.') {
        if !at.is_object() {
            *at = Value::Object(serde_json::Map::new());
        }
        at = at
            .as_object_mut()
            .expect("made an object above")
            .entry(part.to_string())
            .or_insert(Value::Null);
    }
    *at = value;
}
