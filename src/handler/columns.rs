//! The input columns a job's request or command names ([`columns_used`]): what its plan
//! keeps of each row.

use super::{exec, http, template};

/// The input columns a job's request (URL, headers, body) or command names with `{column}`
/// slots, in order of first appearance: what its plan must keep of each row.
pub(crate) fn columns_used(
    request: &http::RequestSpec,
    exec: Option<&exec::ExecSpec>,
) -> Vec<String> {
    let mut out = Vec::new();
    match exec {
        Some(exec) => {
            for word in shlex::split(&exec.command).unwrap_or_default() {
                template::columns_in(&word, &mut out);
            }
        }
        None => {
            template::columns_in(&request.url, &mut out);
            for header in &request.headers {
                template::columns_in(header, &mut out);
            }
            if let Some(body) = &request.body {
                template::columns_in(body, &mut out);
            }
        }
    }
    out
}
