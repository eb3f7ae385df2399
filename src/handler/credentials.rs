//! The job's credentials as its handlers use them ([`Credentials`]): built from the spec's
//! definitions (their commands, token URLs, client IDs and secrets with `${VAR}` expanded
//! from the environment), read before each request, and a refusal of one turned into what
//! happens next.
//!
//! | the request made with the credentials | next |
//! |---|---|
//! | refused (HTTP 401, or 403 when asked; an exec job's exit code [`REFUSED_EXIT_CODE`]) | renew (single flight), then [`Next::Renewed`]: retried at once, using no attempt |
//! | refused again right after a renewal it caused | [`Next::CredentialRejected`]: the run stops, the ID stays pending |
//! | the credential cannot be had for now | retried as the API out of reach (backoff, outage limit) |
//! | the credential is rejected by its source (a token endpoint refusing the client) | [`Next::CredentialRejected`] |

use std::sync::Arc;
use std::time::Duration;

use super::error::HandlerError;
use super::template::expand_env;
use crate::credential::command::CommandSource;
use crate::credential::oauth2::{OAuth2Config, OAuth2Source};
use crate::credential::{
    Credential, CredentialKind, CredentialSource, CredentialSpec, CredentialValue,
};
use crate::failure::{Failure, Next};
use crate::secrets::Secrets;
use crate::setting::Setting;

/// The exit code by which an exec job's command says its credential was refused
/// (`EX_NOPERM` of sysexits.h): the credential is renewed and the ID run again.
pub(crate) const REFUSED_EXIT_CODE: i32 = 77;

/// A job's credentials, in the order of its spec (a template's credential slot is an index
/// into them). Cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct Credentials {
    list: Vec<Arc<Credential>>,
    renew_on_403: bool,
    /// Every secret of every credential (values as they are renewed, what was expanded to
    /// define them).
    secrets: Secrets,
}

impl Credentials {
    /// No credentials.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// Credentials a library program made itself; `renew_on_403`: a 403 refuses them too.
    pub fn from_list(list: Vec<Arc<Credential>>, renew_on_403: bool) -> Credentials {
        let secrets = Secrets::new();
        for c in &list {
            c.secrets().feed(&secrets);
        }
        Credentials {
            list,
            renew_on_403,
            secrets,
        }
    }

    /// Build the credentials `specs` define, expanding `${VAR}` with `env`; a command gets
    /// `timeout`, a token endpoint `connect_timeout` and `timeout`. Nothing is fetched yet.
    pub fn build(
        specs: &[CredentialSpec],
        connect_timeout: Duration,
        timeout: Duration,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Credentials, HandlerError> {
        let mut list = Vec::new();
        for spec in specs {
            // What `${VAR}` expands to in its definition is masked like its values.
            let expanded = std::cell::RefCell::new(Vec::new());
            let env = |name: &str| {
                let value = env(name);
                expanded.borrow_mut().extend(value.clone());
                value
            };
            let env: &dyn Fn(&str) -> Option<String> = &env;
            let what = Setting::Credential(spec.name.clone());
            let source = match &spec.kind {
                CredentialKind::Command { command } => {
                    let invalid = |reason: &str| HandlerError::Invalid {
                        what: what.clone(),
                        reason: reason.into(),
                    };
                    let words = shlex::split(command)
                        .ok_or_else(|| invalid("unbalanced quotes or a trailing backslash"))?;
                    let argv = words
                        .iter()
                        .map(|w| expand_env(w, &what, env))
                        .collect::<Result<Vec<_>, _>>()?;
                    let source = CommandSource::new(argv, timeout)
                        .ok_or_else(|| invalid("no program given"))?;
                    CredentialSource::Command(source)
                }
                CredentialKind::OAuth2 {
                    token_url,
                    client_id,
                    client_secret,
                    scope,
                    client_auth,
                } => {
                    let token_url = expand_env(token_url, &what, env)?;
                    match reqwest::Url::parse(&token_url) {
                        Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                        _ => {
                            return Err(HandlerError::Invalid {
                                what,
                                reason: "the token URL is not an http or https URL".into(),
                            })
                        }
                    }
                    let config = OAuth2Config {
                        token_url,
                        client_id: expand_env(client_id, &Setting::OAuth2ClientId, env)?,
                        client_secret: expand_env(
                            client_secret,
                            &Setting::OAuth2ClientSecret,
                            env,
                        )?,
                        scope: scope.clone(),
                        client_auth: *client_auth,
                    };
                    let source = OAuth2Source::new(config, connect_timeout, timeout)
                        .map_err(HandlerError::Client)?;
                    CredentialSource::OAuth2(source)
                }
            };
            let credential = Credential::new(&spec.name, source, spec.every);
            for value in expanded.take() {
                credential.secrets().add(&value);
            }
            list.push(Arc::new(credential));
        }
        Ok(Credentials::from_list(
            list,
            specs.iter().any(|s| s.renew_on_403),
        ))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The credentials, in order.
    pub fn list(&self) -> &[Arc<Credential>] {
        &self.list
    }

    /// Their names, in order (what templates know them by).
    pub(crate) fn names(&self) -> Vec<&str> {
        self.list.iter().map(|c| c.name()).collect()
    }

    /// The current value of each, renewed first where due. A credential that cannot be had
    /// is the failed attempt.
    pub(crate) async fn values(&self) -> Result<Vec<CredentialValue>, Failure> {
        let mut values = Vec::with_capacity(self.list.len());
        for c in &self.list {
            values.push(c.get().await.map_err(|e| e.into_failure())?);
        }
        Ok(values)
    }

    /// Whether an answer of `status` refuses the credentials.
    pub(crate) fn refuses(&self, status: u16) -> bool {
        !self.list.is_empty() && (status == 401 || (status == 403 && self.renew_on_403))
    }

    /// The attempt made with `used` was refused (`failure`): renew, and say what happens
    /// next (see the module doc).
    pub(crate) async fn refused(&self, used: &[CredentialValue], failure: Failure) -> Failure {
        let mut failure = failure;
        for (credential, value) in self.list.iter().zip(used) {
            failure = credential.after_refusal(value, failure).await;
            if failure.next != Next::Renewed {
                break;
            }
        }
        failure
    }

    /// An attempt made with `used` got an answer that does not refuse them.
    pub(crate) fn accepted(&self, used: &[CredentialValue]) {
        for (credential, value) in self.list.iter().zip(used) {
            credential.accepted(value);
        }
    }

    /// Every secret of the credentials, renewed values included as they arrive.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(renew_on_403: bool) -> Vec<CredentialSpec> {
        vec![CredentialSpec {
            name: "TOKEN".into(),
            kind: CredentialKind::Command {
                command: "printf '%s' ${WHO}".into(),
            },
            every: None,
            renew_on_403,
        }]
    }

    fn build(specs: &[CredentialSpec]) -> Result<Credentials, HandlerError> {
        let env = |name: &str| (name == "WHO").then(|| "me".to_string());
        Credentials::build(specs, Duration::from_secs(5), Duration::from_secs(5), &env)
    }

    #[test]
    fn a_401_refuses_the_credentials_and_a_403_only_when_asked() {
        let plain = build(&specs(false)).unwrap();
        assert!(plain.refuses(401) && !plain.refuses(403) && !plain.refuses(404));
        assert!(build(&specs(true)).unwrap().refuses(403));
        assert!(
            !Credentials::none().refuses(401),
            "no credential: a 401 is the ID's"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_is_split_and_expanded_when_built() {
        let c = build(&specs(false)).unwrap();
        let values = c.values().await.unwrap();
        assert_eq!(values[0].expose(), "me");
        let mut missing = specs(false);
        missing[0].kind = CredentialKind::Command {
            command: "echo ${NOPE}".into(),
        };
        let err = build(&missing).unwrap_err().to_string();
        assert!(
            err.contains("NOPE") && err.contains("credential TOKEN"),
            "{err}"
        );
    }
}
