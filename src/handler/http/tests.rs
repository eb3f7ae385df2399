//! The HTTP handler's unit tests: templates, statuses, Retry-After, URLs.

use super::compiled::UrlTemplate;
use super::*;
use crate::handler::template::IdEncoding;

fn env(name: &str) -> Option<String> {
    match name {
        "TOKEN" => Some("s3cret".into()),
        "HOST" => Some("127.0.0.1:9".into()),
        _ => None,
    }
}

fn spec(url: &str) -> RequestSpec {
    RequestSpec {
        method: "GET".into(),
        url: url.into(),
        headers: vec![],
        body: None,
        connect_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
    }
}

#[test]
fn statuses_are_classified() {
    let after = Some(Duration::from_secs(3));
    assert_eq!(classify_status(429, after), Next::TooMany { after });
    for s in [503, 529] {
        assert_eq!(classify_status(s, after), Next::Pushback { after }, "{s}");
    }
    assert_eq!(classify_status(408, None), Next::Retry { after: None });
    for s in [500, 502, 504, 599] {
        assert_eq!(
            classify_status(s, after),
            Next::Unreachable { after },
            "{s}"
        );
    }
    for s in [400, 401, 403, 404, 410, 422, 302] {
        assert_eq!(classify_status(s, after), Next::Permanent, "{s}");
    }
}

#[test]
fn retry_after_forms() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
    assert_eq!(parse_retry_after("0", now), None);
    assert_eq!(parse_retry_after("-5", now), None);
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("99999", now), Some(MAX_RETRY_AFTER));
    let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
    assert_eq!(
        parse_retry_after(&later, now),
        Some(Duration::from_secs(30))
    );
    let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
    assert_eq!(parse_retry_after(&earlier, now), None);
}

#[test]
fn url_id_is_percent_encoded_in_path_and_query() {
    let t = Template::parse(
        "http://${HOST}/a/{id}?q={id}&k=${TOKEN}",
        &Setting::Url,
        IdEncoding::Url,
        &env,
    )
    .unwrap();
    assert_eq!(
        t.render("a/b c?d#e%f&g=h+é"),
        "http://127.0.0.1:9/a/a%2Fb%20c%3Fd%23e%25f%26g%3Dh%2B%C3%A9?q=a%2Fb%20c%3Fd%23e%25f%26g%3Dh%2B%C3%A9&k=s3cret"
    );
}

#[test]
fn env_values_are_not_templates_and_ids_are_not_expanded() {
    let t = Template::parse("x{id}y", &Setting::Url, IdEncoding::Raw, &|_| {
        Some("{id}".into())
    })
    .unwrap();
    assert_eq!(t.render("${TOKEN}"), "x${TOKEN}y");
}

#[test]
fn body_id_is_json_escaped() {
    let t = Template::parse(r#"{"id":"{id}"}"#, &Setting::Body, IdEncoding::Json, &env).unwrap();
    let body = t.render("a\"b\\c\nd");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], "a\"b\\c\nd");
}

#[test]
fn missing_variable_is_named() {
    let err = HttpHandler::with_env(&spec("http://x/{id}?k=${NOPE}"), &env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("NOPE") && err.contains("url"), "{err}");
    let mut s = spec("http://x/{id}");
    s.headers = vec!["Authorization: Bearer ${MISSING}".into()];
    let err = HttpHandler::with_env(&s, &env).unwrap_err().to_string();
    assert!(
        err.contains("MISSING") && err.contains("authorization"),
        "{err}"
    );
}

#[test]
fn bad_templates_are_refused() {
    assert!(HttpHandler::with_env(&spec("http://x/y"), &env).is_err());
    assert!(HttpHandler::with_env(&spec("ftp://x/{id}"), &env).is_err());
    assert!(HttpHandler::with_env(&spec("http://x/{id}${"), &env).is_err());
    let mut s = spec("http://x/{id}");
    s.headers = vec!["NoColon".into()];
    assert!(HttpHandler::with_env(&s, &env).is_err());
    s.method = "BAD METHOD".into();
    assert!(HttpHandler::with_env(&s, &env).is_err());
}

#[test]
fn id_may_stand_in_the_body_or_a_header_only() {
    let mut s = spec("http://x/items");
    s.method = "POST".into();
    s.body = Some(r#"{"id":"{id}"}"#.into());
    assert!(check_templates(&s, &[]).is_ok());
    s.body = None;
    s.headers = vec!["X-Id: {id}".into()];
    assert!(check_templates(&s, &[]).is_ok());
    s.headers = vec![];
    let err = check_templates(&s, &[]).unwrap_err().to_string();
    assert!(err.contains("appears in none of"), "{err}");
}

#[test]
fn check_templates_needs_no_environment() {
    assert!(check_templates(&spec("http://${HOST}/{id}?k=${UNSET_ANYWHERE}"), &[]).is_ok());
    assert!(check_templates(&spec("http://x/{id}${"), &[]).is_err());
}

#[tokio::test]
async fn dot_ids_are_refused_where_they_would_change_the_path() {
    let h = HttpHandler::with_env(&spec("http://127.0.0.1:9/items/{id}"), &env).unwrap();
    for id in [".", ".."] {
        let err = h.attempt(id).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Request, "{id}");
    }
    let whole = |t: &str| {
        Template::parse(t, &Setting::Url, IdEncoding::Url, &env)
            .unwrap()
            .id_is_path_segment()
    };
    assert!(whole("http://h/a/{id}"));
    assert!(whole("http://h/a/{id}/b"));
    assert!(whole("http://h/a/{id}?q=1"));
    assert!(!whole("http://h/a/x{id}"));
    assert!(!whole("http://h/a/{id}.json"));
    assert!(!whole("http://h/a?id={id}"));
}

#[test]
fn debug_does_not_show_secrets() {
    let mut s = spec("http://x/{id}?k=${TOKEN}");
    s.headers = vec!["Authorization: Bearer ${TOKEN}".into()];
    let h = HttpHandler::with_env(&s, &env).unwrap();
    assert!(!format!("{h:?}").contains("s3cret"));
}

#[tokio::test]
async fn transport_errors_do_not_leak_the_url() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let h = HttpHandler::with_env(
        &spec(&format!("http://127.0.0.1:{port}/{{id}}?k=${{TOKEN}}")),
        &env,
    )
    .unwrap();
    let err = h.attempt("x").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Connect);
    assert_eq!(err.next, Next::Unreachable { after: None });
    assert!(!err.message.contains("s3cret"), "{}", err.message);
}

#[test]
fn urls_from_the_parsed_base_equal_parsing_the_whole_text() {
    let templates = [
        "http://h/items/{id}",
        "http://127.0.0.1:8080/items/{id}",
        "http://h:81/a/{id}?x={id}&y=1#f{id}",
        "https://user:pw@h/{id}/x/../y",
        "http://h?q={id}",
        "http://h#{id}",
        "http://h/{id}\\x",
        "http://H.example/%7E/{id}/./z",
        "http://h/a b/{id}",
        "http://h/é/{id}?é={id}",
        "HTTP://h:80/{id}",
        "http://h/{id}?",
        "http://h/{id}#",
        "http://[::1]:9/{id}",
        "{id}",
        "http://{id}.example/x",
    ];
    let ids = ["a", ".", "..", "x y", "é", "a/b?c#d%", "", "%2e", "\\"];
    for t in templates {
        let template = Template::parse(t, &Setting::Url, IdEncoding::Url, &|_| None).unwrap();
        let url = UrlTemplate::new(template);
        let expect_base = !t.starts_with("{id}") && !t.contains("://{id}");
        assert_eq!(url.base.is_some(), expect_base, "{t}");
        for id in ids {
            let whole = reqwest::Url::parse(&url.template.render(id)).map_err(|e| e.to_string());
            assert_eq!(
                url.url(&url.template.render_with(id, &[])),
                whole,
                "template {t:?}, id {id:?}"
            );
        }
    }
}
