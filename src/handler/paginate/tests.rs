//! The pager's unit tests: each style's flag text, items and next request, the request
//! changes, and the spec as stored.

use reqwest::Url;
use serde_json::{json, Value};

use super::*;
use crate::setting::Setting;

fn url(text: &str) -> Url {
    Url::parse(text).unwrap()
}

fn pager(style: PageStyle) -> Pager {
    Pager::compile(&PaginateSpec {
        style,
        items: ".data[]?".into(),
        max_pages: DEFAULT_MAX_PAGES,
    })
    .unwrap()
}

fn style(text: &str, param: Option<&str>) -> PageStyle {
    PageStyle::parse(text, param, None, None).unwrap()
}

/// The next request after a page of `body` (and `headers`), page 0 of a request to
/// `https://api.test/r?id=1`, `count` items kept.
fn next_of(
    pager: &Pager,
    headers: &[(&str, &[u8])],
    body: Value,
    count: u32,
) -> Result<Option<NextRequest>, NextError> {
    let first = url("https://api.test/r?id=1");
    let seen = PageSeen {
        request_url: &first,
        status: 200,
        headers,
        body: &body,
        page: 0,
        items_before: 0,
    };
    pager.next(&first, &seen, count)
}

fn next_url(text: &str) -> Option<NextRequest> {
    Some(NextRequest::Url(text.into()))
}

#[test]
fn flag_text_names_each_style() {
    assert_eq!(style("link", None), PageStyle::Link);
    assert_eq!(
        style("next-url=.links.next", None),
        PageStyle::NextUrl {
            program: ".links.next".into()
        }
    );
    assert_eq!(
        style("cursor=.next_cursor", Some("body:page.after")),
        PageStyle::Cursor {
            program: ".next_cursor".into(),
            param: ParamPlace::Body("page.after".into())
        }
    );
    assert_eq!(
        PageStyle::parse("page", Some("p"), Some(0), Some(100)).unwrap(),
        PageStyle::Page {
            param: ParamPlace::Query("p".into()),
            start: 0,
            size: Some(100)
        }
    );
    assert_eq!(
        style("page", Some("p")),
        PageStyle::Page {
            param: ParamPlace::Query("p".into()),
            start: 1,
            size: None
        },
        "pages start at 1 unless told"
    );
    assert_eq!(
        style("offset", Some("offset")),
        PageStyle::Offset {
            param: ParamPlace::Query("offset".into()),
            size: None
        }
    );
    assert_eq!(
        style("jq=.next", None),
        PageStyle::Jq {
            program: ".next".into()
        }
    );
}

#[test]
fn flag_text_that_does_not_fit_is_refused_with_a_reason() {
    let refused = |s: &str, param: Option<&str>, start, size| {
        PageStyle::parse(s, param, start, size)
            .unwrap_err()
            .to_string()
    };
    assert!(refused("links", None, None, None).contains("not a style of paging"));
    assert!(refused("cursor", Some("c"), None, None).contains("needs a jq program"));
    assert!(refused("next-url= ", None, None, None).contains("needs a jq program"));
    assert!(refused("link=.x", None, None, None).contains("takes no program"));
    assert!(refused("cursor=.c", None, None, None).contains("needs page_param"));
    assert!(refused("page", None, None, None).contains("needs page_param"));
    assert!(refused("link", Some("p"), None, None).contains("page_param is not used"));
    assert!(refused("offset", Some("o"), Some(1), None).contains("page_start is not used"));
    assert!(refused("cursor=.c", Some("c"), None, Some(5)).contains("page_size is not used"));
    assert!(refused("page", Some("p"), None, Some(0)).contains("at least 1"));
    assert!(refused("page", Some("body:"), None, None).contains("names no parameter"));
    assert!(refused("page", Some("body:a..b"), None, None).contains("names no parameter"));
    assert!(refused("page", Some(" "), None, None).contains("names no parameter"));
}

#[test]
fn programs_that_are_not_jq_and_no_pages_are_refused() {
    let spec = |style, items: &str, max_pages| PaginateSpec {
        style,
        items: items.into(),
        max_pages,
    };
    let bad_items = Pager::compile(&spec(PageStyle::Link, ".data[", 10)).unwrap_err();
    assert!(
        bad_items.to_string().starts_with("items \".data[\""),
        "{bad_items}"
    );
    let bad_next = Pager::compile(&spec(style("jq=.next |", None), ".[]", 10)).unwrap_err();
    assert!(
        bad_next.to_string().contains("not a valid jq program"),
        "{bad_next}"
    );
    let none = Pager::compile(&spec(PageStyle::Link, ".[]", 0)).unwrap_err();
    assert!(
        none.to_string().contains("max_pages must be at least 1"),
        "{none}"
    );
}

#[test]
fn the_spec_is_stored_as_tagged_json() {
    let spec = PaginateSpec {
        style: style("cursor=.next", Some("body:page.after")),
        items: ".data[]".into(),
        max_pages: 500,
    };
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(
        json,
        json!({"style": {"kind": "cursor", "program": ".next", "param": {"body": "page.after"}},
               "items": ".data[]", "max_pages": 500})
    );
    assert_eq!(serde_json::from_value::<PaginateSpec>(json).unwrap(), spec);
    let link = serde_json::to_value(PageStyle::Link).unwrap();
    assert_eq!(link, json!({"kind": "link"}));
}

#[test]
fn items_are_each_output_of_the_program_with_the_page_bound() {
    let first = url("https://api.test/r");
    let body = json!({"data": [1, 2, 3]});
    let seen = PageSeen {
        request_url: &first,
        status: 200,
        headers: &[],
        body: &body,
        page: 4,
        items_before: 0,
    };
    assert_eq!(
        pager(PageStyle::Link).items(&seen).unwrap(),
        vec![json!(1), json!(2), json!(3)]
    );
    let with_page = Pager::compile(&PaginateSpec {
        style: PageStyle::Link,
        items: ".data[] | {v: ., page: $page, status: $status}".into(),
        max_pages: 1,
    })
    .unwrap();
    assert_eq!(
        with_page.items(&seen).unwrap()[0],
        json!({"v": 1, "page": 4, "status": 200})
    );
    let failing = Pager::compile(&PaginateSpec {
        style: PageStyle::Link,
        items: ".data.x".into(),
        max_pages: 1,
    })
    .unwrap();
    let e = failing.items(&seen).unwrap_err();
    assert!(
        matches!(
            e,
            NextError::Program {
                what: Setting::Items,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn link_follows_rel_next_joined_to_the_request_url_and_ends_without_one() {
    let p = pager(PageStyle::Link);
    let link =
        |v: &'static str| -> Vec<(&'static str, &'static [u8])> { vec![("Link", v.as_bytes())] };
    assert_eq!(
        next_of(&p, &link(r#"</r?id=1&page=2>; rel="next""#), json!([]), 0).unwrap(),
        next_url("https://api.test/r?id=1&page=2"),
        "an empty page with a next link is not the last: the link decides"
    );
    assert_eq!(
        next_of(&p, &link(r#"<page/3>; rel="next last""#), json!([]), 1).unwrap(),
        next_url("https://api.test/page/3")
    );
    assert_eq!(
        next_of(&p, &link(r#"</r?page=9>; rel="last""#), json!([]), 1).unwrap(),
        None
    );
    assert_eq!(next_of(&p, &[], json!([]), 1).unwrap(), None);
    let two_headers: Vec<(&str, &[u8])> = vec![
        ("link", br#"</a>; rel="prev""#),
        ("LINK", br#"</b>; rel="next""#),
    ];
    assert_eq!(
        next_of(&p, &two_headers, json!([]), 1).unwrap(),
        next_url("https://api.test/b")
    );
}

#[test]
fn a_next_url_on_another_origin_is_refused() {
    let p = pager(PageStyle::Link);
    for other in [
        "https://evil.test/r?page=2",
        "http://api.test/r?page=2",
        "https://api.test:8443/r?page=2",
        "//evil.test/r",
    ] {
        let header = format!("<{other}>; rel=next");
        let e = next_of(&p, &[("link", header.as_bytes())], json!([]), 1).unwrap_err();
        assert!(matches!(e, NextError::OtherOrigin { .. }), "{other}: {e}");
        assert!(e.to_string().contains("https://api.test"), "{e}");
    }
    let same = "<https://api.test:443/r?page=2>; rel=next";
    assert!(next_of(&p, &[("link", same.as_bytes())], json!([]), 1).is_ok());
    let p = pager(style("next-url=.next", None));
    let e = next_of(&p, &[], json!({"next": "https://evil.test/"}), 1).unwrap_err();
    assert!(matches!(e, NextError::OtherOrigin { .. }), "{e}");
    let e = next_of(&p, &[], json!({"next": "http://[::1"}), 1).unwrap_err();
    assert!(matches!(e, NextError::BadUrl { .. }), "{e}");
}

#[test]
fn next_url_reads_the_body_and_ends_on_null_empty_false_or_nothing() {
    let p = pager(style("next-url=.links.next", None));
    assert_eq!(
        next_of(&p, &[], json!({"links": {"next": "/r?id=1&after=x"}}), 3).unwrap(),
        next_url("https://api.test/r?id=1&after=x")
    );
    for end in [
        json!({"links": {"next": null}}),
        json!({"links": {"next": ""}}),
        json!({"links": {"next": false}}),
        json!({}),
    ] {
        assert_eq!(next_of(&p, &[], end.clone(), 3).unwrap(), None, "{end}");
    }
    let p = pager(style("next-url=.links.next | select(. != null)", None));
    assert_eq!(
        next_of(&p, &[], json!({"links": {}}), 3).unwrap(),
        None,
        "no output"
    );
    let p = pager(style("next-url=.next", None));
    let e = next_of(&p, &[], json!({"next": 5}), 3).unwrap_err();
    assert!(matches!(e, NextError::Malformed { .. }), "{e}");
    let p = pager(style("next-url=.next[]", None));
    let e = next_of(&p, &[], json!({"next": ["/a", "/b"]}), 3).unwrap_err();
    assert!(e.to_string().contains("more than one output"), "{e}");
    let p = pager(style("next-url=.next.x", None));
    let e = next_of(&p, &[], json!({"next": "a"}), 3).unwrap_err();
    assert!(matches!(e, NextError::Program { .. }), "{e}");
}

#[test]
fn a_cursor_goes_to_its_query_parameter_or_body_field_and_ends_on_null_or_empty() {
    let p = pager(style("cursor=.next_cursor", Some("cursor")));
    assert_eq!(
        next_of(&p, &[], json!({"next_cursor": "abc=="}), 50).unwrap(),
        Some(NextRequest::Query(vec![("cursor".into(), "abc==".into())]))
    );
    assert_eq!(
        next_of(&p, &[], json!({"next_cursor": 1234}), 50).unwrap(),
        Some(NextRequest::Query(vec![("cursor".into(), "1234".into())])),
        "a number is written as its text"
    );
    for end in [json!(""), json!(null), json!(false)] {
        assert_eq!(
            next_of(&p, &[], json!({"next_cursor": end}), 50).unwrap(),
            None
        );
    }
    let e = next_of(&p, &[], json!({"next_cursor": {"a": 1}}), 50).unwrap_err();
    assert!(e.to_string().contains("not a cursor"), "{e}");
    let stripe = pager(style(
        "cursor=if .has_more then .data[-1].id else null end",
        Some("body:page.after"),
    ));
    assert_eq!(
        next_of(
            &stripe,
            &[],
            json!({"has_more": true, "data": [{"id": "a"}, {"id": "b"}]}),
            2
        )
        .unwrap(),
        Some(NextRequest::Body(vec![("page.after".into(), json!("b"))]))
    );
    assert_eq!(
        next_of(
            &stripe,
            &[],
            json!({"has_more": false, "data": [{"id": "a"}]}),
            1
        )
        .unwrap(),
        None
    );
}

#[test]
fn page_numbers_count_up_from_the_start_and_end_on_an_empty_or_short_page() {
    let p = pager(PageStyle::parse("page", Some("page"), Some(1), Some(50)).unwrap());
    assert_eq!(
        next_of(&p, &[], json!([]), 50).unwrap(),
        Some(NextRequest::Query(vec![("page".into(), "2".into())]))
    );
    assert_eq!(next_of(&p, &[], json!([]), 49).unwrap(), None, "short");
    assert_eq!(next_of(&p, &[], json!([]), 0).unwrap(), None, "empty");
    let no_size = pager(PageStyle::parse("page", Some("body:p"), Some(0), None).unwrap());
    assert_eq!(
        next_of(&no_size, &[], json!([]), 3).unwrap(),
        Some(NextRequest::Body(vec![("p".into(), json!(1))])),
        "without a size, only an empty page is the last; a body field gets a number"
    );
    assert_eq!(next_of(&no_size, &[], json!([]), 0).unwrap(), None);
    let first = url("https://api.test/r");
    let body = json!([]);
    let later = PageSeen {
        request_url: &first,
        status: 200,
        headers: &[],
        body: &body,
        page: 6,
        items_before: 300,
    };
    assert_eq!(
        p.next(&first, &later, 50).unwrap(),
        Some(NextRequest::Query(vec![("page".into(), "8".into())])),
        "page 6 counted from 0 was number 7"
    );
}

#[test]
fn offsets_count_the_items_seen_and_end_on_an_empty_or_short_page() {
    let p = pager(PageStyle::parse("offset", Some("offset"), None, Some(100)).unwrap());
    let first = url("https://api.test/r");
    let body = json!([]);
    let seen = PageSeen {
        request_url: &first,
        status: 200,
        headers: &[],
        body: &body,
        page: 2,
        items_before: 200,
    };
    assert_eq!(
        p.next(&first, &seen, 100).unwrap(),
        Some(NextRequest::Query(vec![("offset".into(), "300".into())]))
    );
    assert_eq!(p.next(&first, &seen, 99).unwrap(), None);
    assert_eq!(p.next(&first, &seen, 0).unwrap(), None);
}

#[test]
fn the_jq_form_gives_a_url_or_one_change_of_the_first_request() {
    let p = pager(style("jq=.next", None));
    let next = |v: Value| next_of(&p, &[], json!({ "next": v }), 5);
    assert_eq!(
        next(json!("?id=1&p=2")).unwrap(),
        next_url("https://api.test/r?id=1&p=2")
    );
    assert_eq!(
        next(json!({"url": "/x"})).unwrap(),
        next_url("https://api.test/x")
    );
    assert_eq!(
        next(json!({"query": {"p": 2, "q": "a b", "f": true}})).unwrap(),
        Some(NextRequest::Query(vec![
            ("f".into(), "true".into()),
            ("p".into(), "2".into()),
            ("q".into(), "a b".into()),
        ]))
    );
    assert_eq!(
        next(json!({"body": {"page.after": {"id": 7}}})).unwrap(),
        Some(NextRequest::Body(vec![(
            "page.after".into(),
            json!({"id": 7})
        )]))
    );
    assert_eq!(next(json!(null)).unwrap(), None);
    assert_eq!(next(json!("")).unwrap(), None);
    for bad in [
        json!(5),
        json!([1]),
        json!({}),
        json!({"url": "/x", "query": {"p": 1}}),
        json!({"url": 5}),
        json!({"query": {"p": [1]}}),
        json!({"query": {}}),
        json!({"query": "p=1"}),
        json!({"body": {"a..b": 1}}),
        json!({"body": []}),
        json!({"headers": {}}),
    ] {
        let e = next(bad.clone()).unwrap_err();
        assert!(matches!(e, NextError::Malformed { .. }), "{bad}: {e}");
    }
    let with_count = pager(style(
        "jq=if $count < 5 then null else {query: {page: ($page + 2)}} end",
        None,
    ));
    assert_eq!(
        next_of(&with_count, &[], json!({}), 5).unwrap(),
        Some(NextRequest::Query(vec![("page".into(), "2".into())]))
    );
    assert_eq!(next_of(&with_count, &[], json!({}), 4).unwrap(), None);
}

#[test]
fn query_parameters_are_replaced_in_place_and_encoded() {
    let first = url("https://api.test/r?a=1&cursor=old&b=x%20y&cursor=older");
    let set = set_query(
        &first,
        &[
            ("cursor".into(), "n/x+y=&z".into()),
            ("new".into(), "é".into()),
        ],
    );
    assert_eq!(
        set.as_str(),
        "https://api.test/r?a=1&cursor=n%2Fx%2By%3D%26z&b=x+y&new=%C3%A9"
    );
    let pairs: Vec<(String, String)> = set
        .query_pairs()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    assert_eq!(pairs[1], ("cursor".to_string(), "n/x+y=&z".to_string()));
    let bare = set_query(&url("https://api.test/r"), &[("page".into(), "2".into())]);
    assert_eq!(bare.as_str(), "https://api.test/r?page=2");
}

#[test]
fn a_body_path_is_set_making_objects_on_the_way() {
    let mut body = json!({"query": "x", "page": {"size": 10}, "flat": 1});
    set_body_path(&mut body, "page.after", json!("c1"));
    set_body_path(&mut body, "cursor", json!(3));
    set_body_path(&mut body, "flat.deep", json!(true));
    assert_eq!(
        body,
        json!({"query": "x", "page": {"size": 10, "after": "c1"}, "cursor": 3, "flat": {"deep": true}})
    );
    let mut nothing = Value::Null;
    set_body_path(&mut nothing, "a.b", json!(1));
    assert_eq!(nothing, json!({"a": {"b": 1}}));
}

/// The pager against the fake API's paginated routes: every item once, in order, and the
/// last page found by each style's own rule.
#[cfg(feature = "demo")]
mod against_the_fake_api {
    use crate::demo::api::{ApiConfig, FakeApi};
    use crate::handler::paginate::{
        set_query, NextRequest, PageSeen, PageStyle, Pager, PaginateSpec,
    };

    /// Every item of `id`, walking the pages of `first` as the pager says.
    async fn walk(c: &reqwest::Client, style: PageStyle, first: &str) -> (Vec<u64>, u32) {
        let items = match style {
            PageStyle::Cursor { .. } => ".data[]",
            _ => ".[]",
        };
        let pager = Pager::compile(&PaginateSpec {
            style,
            items: items.into(),
            max_pages: 100,
        })
        .unwrap();
        let first = reqwest::Url::parse(first).unwrap();
        let mut url = first.clone();
        let (mut seen, mut pages, mut before) = (Vec::new(), 0, 0);
        loop {
            let resp = c.get(url.clone()).send().await.unwrap();
            let status = resp.status().as_u16();
            let headers: Vec<(String, Vec<u8>)> = resp
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect();
            let headers: Vec<(&str, &[u8])> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            let body: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            let page = PageSeen {
                request_url: &url,
                status,
                headers: &headers,
                body: &body,
                page: pages,
                items_before: before,
            };
            let kept = pager.items(&page).unwrap();
            let next = pager.next(&first, &page, kept.len() as u32).unwrap();
            seen.extend(kept.iter().map(|i| i["k"].as_u64().unwrap()));
            before += kept.len() as u64;
            pages += 1;
            url = match next {
                None => return (seen, pages),
                Some(NextRequest::Url(next)) => reqwest::Url::parse(&next).unwrap(),
                Some(NextRequest::Query(pairs)) => set_query(&first, &pairs),
                Some(NextRequest::Body(_) | NextRequest::UrlKeeping { .. }) => {
                    panic!("the pager gives neither a body nor a kept URL on these routes")
                }
            };
        }
    }

    #[tokio::test]
    async fn the_pager_walks_every_route_to_its_end() {
        let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        let all = |n: u64| (0..n).collect::<Vec<u64>>();
        let link = api.pages_link_url_template().replace("{id}", "p230-l") + "?per_page=50";
        assert_eq!(walk(&c, PageStyle::Link, &link).await, (all(230), 5));
        let cursor = PageStyle::parse("cursor=.next_cursor", Some("cursor"), None, None).unwrap();
        let url = api.pages_cursor_url_template().replace("{id}", "p230-c");
        assert_eq!(walk(&c, cursor, &url).await, (all(230), 5));
        let offset = PageStyle::parse("offset", Some("offset"), None, Some(50)).unwrap();
        let url = api.pages_offset_url_template().replace("{id}", "p200-o") + "?limit=50";
        assert_eq!(
            walk(&c, offset, &url).await,
            (all(200), 5),
            "four full pages, then an empty one"
        );
        let page = PageStyle::parse("page", Some("page"), Some(1), Some(40)).unwrap();
        let url = api.pages_link_url_template().replace("{id}", "p90-p") + "?per_page=40";
        assert_eq!(
            walk(&c, page, &url).await,
            (all(90), 3),
            "a short last page"
        );
        api.shutdown().await;
    }
}
