//! The credential's unit tests: single-flight renewal, proactive renewal, rejection after a
//! renewal that did not help, a value outliving a failing renewal, redaction, and the OAuth2
//! grant against the fake API's token endpoint.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::command::CommandSource;
use super::*;
use crate::failure::Next;

/// A credential whose command prints `tok-N`, N counting its runs in `dir/count`.
fn counting(dir: &Path, every: Option<Duration>) -> Credential {
    let count = dir.join("count");
    let script = format!(
        "n=$(cat '{0}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{0}'; echo tok-$n",
        count.display()
    );
    let source = CommandSource::new(
        vec!["sh".into(), "-c".into(), script],
        Duration::from_secs(20),
    )
    .unwrap();
    Credential::new("TOKEN", CredentialSource::Command(source), every)
}

fn runs(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("count"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_refusals_of_one_value_renew_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(counting(dir.path(), None));
    let first = c.get().await.unwrap();
    assert_eq!((first.expose(), first.generation()), ("tok-1", 1));
    c.accepted(&first);
    let refusals: Vec<_> = (0..64)
        .map(|_| {
            let (c, first) = (c.clone(), first.clone());
            tokio::spawn(async move { c.refused(&first).await })
        })
        .collect();
    for r in refusals {
        assert_eq!(r.await.unwrap(), Ok(Refusal::Renewed));
    }
    assert_eq!(runs(dir.path()), 2, "one renewal for 64 refusals");
    assert_eq!(c.renewals(), 2);
    let second = c.get().await.unwrap();
    assert_eq!((second.expose(), second.generation()), ("tok-2", 2));
    // A late refusal of the old value renews nothing.
    assert_eq!(c.refused(&first).await, Ok(Refusal::Renewed));
    assert_eq!(runs(dir.path()), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_refused_right_after_its_renewal_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let c = counting(dir.path(), None);
    let first = c.get().await.unwrap();
    // The first value refused before anything worked with it: renewed (it may have been
    // stale), not rejected.
    assert_eq!(c.refused(&first).await, Ok(Refusal::Renewed));
    let second = c.get().await.unwrap();
    // Renewed because of a refusal and refused again before any success: rejected, and
    // nothing more is renewed.
    assert_eq!(c.refused(&second).await, Ok(Refusal::Rejected));
    assert_eq!(runs(dir.path()), 2);
    // Once a request worked with it, a refusal is its expiry: renewed.
    c.accepted(&second);
    assert_eq!(c.refused(&second).await, Ok(Refusal::Renewed));
    assert_eq!(c.get().await.unwrap().expose(), "tok-3");
}

/// A refusal of a value that worked for a request read after it was no expiry: the value
/// is renewed all the same, but the refusal is said to be the request's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_alone_when_a_later_read_of_the_value_was_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let c = counting(dir.path(), None);
    let early = c.get().await.unwrap();
    let late = c.get().await.unwrap();
    c.accepted(&early);
    // Accepted only up to the refused read's own time: it expired for everyone.
    assert_eq!(c.refused(&late).await, Ok(Refusal::Renewed));
    let (a, b) = (c.get().await.unwrap(), c.get().await.unwrap());
    assert_eq!((a.generation(), b.generation()), (2, 2));
    c.accepted(&a);
    c.accepted(&b);
    // `a` was refused, but `b`, read after it, was accepted: not the value's expiry.
    assert_eq!(c.refused(&a).await, Ok(Refusal::RenewedAlone));
    assert_eq!(c.get().await.unwrap().expose(), "tok-3");
    // Told apart per generation, even once the value moved on.
    assert_eq!(c.refused(&a).await, Ok(Refusal::RenewedAlone));
    assert_eq!(c.refused(&late).await, Ok(Refusal::Renewed));
    assert_eq!(runs(dir.path()), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_value_is_renewed_before_use_and_a_fresh_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let c = counting(dir.path(), Some(Duration::from_secs(3600)));
    assert_eq!(c.get().await.unwrap().expose(), "tok-1");
    assert_eq!(c.get().await.unwrap().expose(), "tok-1", "not due yet");
    c.state().due = Some(Instant::now());
    assert_eq!(c.get().await.unwrap().expose(), "tok-2", "due: renewed");
    assert_eq!(runs(dir.path()), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_not_yet_expired_outlives_a_renewal_that_fails_for_now() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    // Prints tok-1 once, then fails.
    let script = format!(
        "n=$(cat '{0}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{0}'; \
         [ $n -eq 1 ] || {{ echo 'endpoint down' >&2; exit 1; }}; echo tok-$n",
        count.display()
    );
    let source = CommandSource::new(
        vec!["sh".into(), "-c".into(), script],
        Duration::from_secs(20),
    )
    .unwrap();
    let c = Credential::new("TOKEN", CredentialSource::Command(source), None);
    assert_eq!(c.get().await.unwrap().expose(), "tok-1");
    c.state().due = Some(Instant::now());
    // Due, the renewal fails, the old value still works: used.
    assert_eq!(c.get().await.unwrap().expose(), "tok-1");
    assert_eq!(runs(dir.path()), 2);
    // Within the backoff after that failure: used without trying again.
    assert_eq!(c.get().await.unwrap().expose(), "tok-1");
    assert_eq!(runs(dir.path()), 2);
    // Expired: the failure is the caller's.
    c.state().expires = Some(Instant::now());
    c.state().retry_at = None;
    let e = c.get().await.unwrap_err();
    assert!(e.to_string().contains("endpoint down"), "{e}");
    assert_eq!(runs(dir.path()), 3);
}

#[test]
fn renewal_comes_before_expiry_by_a_margin() {
    let s = Duration::from_secs;
    assert_eq!(due_in(Some(s(3)), None), Some(Duration::from_millis(2700)));
    assert_eq!(
        due_in(Some(s(3600)), None),
        Some(s(3540)),
        "at most 60 s early"
    );
    assert_eq!(due_in(Some(s(3600)), Some(s(600))), Some(s(600)));
    assert_eq!(due_in(None, Some(s(600))), Some(s(600)));
    assert_eq!(due_in(None, None), None, "renewed only when refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_is_unavailable_with_its_stderr_and_no_secret() {
    let script = "echo 'token service down' >&2; exit 3";
    let source = CommandSource::new(
        vec!["sh".into(), "-c".into(), script.into()],
        Duration::from_secs(20),
    )
    .unwrap();
    let c = Credential::new("TOKEN", CredentialSource::Command(source), None);
    let e = c.get().await.unwrap_err();
    assert!(
        matches!(&e, CredentialError::Unavailable { message, .. }
            if message.contains("exit code 3") && message.contains("token service down")),
        "{e}"
    );
    let failure = e.into_failure();
    assert_eq!(failure.next, Next::Unreachable { after: None });
    assert!(failure.message.contains("credential TOKEN"), "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted_and_never_shown_by_debug() {
    let dir = tempfile::tempdir().unwrap();
    let c = counting(dir.path(), None);
    let v = c.get().await.unwrap();
    assert_eq!(
        c.redact("HTTP 401: bad token tok-1 given"),
        "HTTP 401: bad token *** given"
    );
    for debug in [format!("{v:?}"), format!("{c:?}")] {
        assert!(!debug.contains("tok-1"), "{debug}");
    }
    let fetched = Fetched {
        value: "tok-9".into(),
        expires_in: None,
    };
    assert!(!format!("{fetched:?}").contains("tok-9"));
}

#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth2_token_is_renewed_and_a_revoked_client_is_rejected() {
    use super::oauth2::{ClientAuth, OAuth2Config, OAuth2Source};
    use crate::demo::api::{ApiConfig, FakeApi, CLIENT_ID, CLIENT_SECRET};

    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    api.require_token(Duration::from_secs(3));
    let config = OAuth2Config {
        token_url: api.token_url(),
        client_id: CLIENT_ID.into(),
        client_secret: CLIENT_SECRET.into(),
        scope: Some("items:read".into()),
        client_auth: ClientAuth::Basic,
    };
    assert!(!format!("{config:?}").contains(CLIENT_SECRET));
    let source = OAuth2Source::new(config, Duration::from_secs(5), Duration::from_secs(5));
    let c = Credential::new("TOKEN", CredentialSource::OAuth2(source.unwrap()), None);
    let v = c.get().await.unwrap();
    assert!(v.expose().starts_with("tok-"));
    assert_eq!(api.tokens_issued(), 1);
    assert!(c.state().due.is_some(), "expires_in is honoured");
    api.revoke_client_secret(true);
    c.accepted(&v);
    let e = c.refused(&v).await.unwrap_err();
    assert!(
        matches!(&e, CredentialError::Rejected { message, .. } if message.contains("invalid_client")),
        "{e}"
    );
    assert!(!e.to_string().contains(CLIENT_SECRET), "{e}");
    assert_eq!(e.into_failure().next, Next::CredentialRejected);
    api.revoke_client_secret(false);
    assert_eq!(c.refused(&v).await, Ok(Refusal::Renewed));
    assert_eq!(api.tokens_issued(), 2);
}

/// A token endpoint that does not decode Basic auth accepts the client as highwater sends it
/// (an ID with dashes, a secret with `-` and `+`-worthy characters stay readable: the form
/// serializer's encoding leaves `*-._` alone); one that wants the credentials in the form
/// body gets them there with `ClientAuth::Post`, and refuses Basic auth.
#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_client_auth_suits_servers_that_do_not_decode_or_want_the_form_body() {
    use super::oauth2::{form_encode, ClientAuth, OAuth2Config, OAuth2Source};
    use crate::demo::api::{ApiConfig, FakeApi, TokenClientAuth, CLIENT_ID, CLIENT_SECRET};

    assert_eq!(form_encode("hw-client_1.x*"), "hw-client_1.x*");
    assert_eq!(form_encode("a b+c/d:é"), "a+b%2Bc%2Fd%3A%C3%A9");
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let fetch = |how: ClientAuth| {
        let config = OAuth2Config {
            token_url: api.token_url(),
            client_id: CLIENT_ID.into(),
            client_secret: CLIENT_SECRET.into(),
            scope: None,
            client_auth: how,
        };
        let source = OAuth2Source::new(config, Duration::from_secs(5), Duration::from_secs(5));
        Credential::new("TOKEN", CredentialSource::OAuth2(source.unwrap()), None)
    };
    assert!(CLIENT_ID.contains('-') && CLIENT_SECRET.contains('-'));
    api.token_client_auth(TokenClientAuth::BasicVerbatim);
    let v = fetch(ClientAuth::Basic).get().await.unwrap();
    assert!(v.expose().starts_with("tok-"));
    assert!(
        fetch(ClientAuth::Post).get().await.is_err(),
        "form body refused"
    );
    api.token_client_auth(TokenClientAuth::PostOnly);
    let v = fetch(ClientAuth::Post).get().await.unwrap();
    assert!(v.expose().starts_with("tok-"));
    let e = fetch(ClientAuth::Basic).get().await.unwrap_err();
    assert!(matches!(&e, CredentialError::Rejected { .. }), "{e}");
    assert!(!e.to_string().contains(CLIENT_SECRET), "{e}");
    assert_eq!(api.tokens_issued(), 2);
}
