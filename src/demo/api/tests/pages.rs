//! The fake API's paginated routes: each style's pages, their ends, and bad requests.

use super::*;

async fn get(c: &reqwest::Client, url: &str) -> (u16, Option<String>, serde_json::Value) {
    let resp = c.get(url).send().await.expect("request");
    let status = resp.status().as_u16();
    let link = resp
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.bytes().await.expect("body");
    (status, link, serde_json::from_slice(&body).expect("json"))
}

fn ks(items: &serde_json::Value) -> Vec<u64> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["k"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn link_pages_point_to_the_next_page_until_the_last() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let base = format!("http://{}", api.addr());
    let first = api.pages_link_url_template().replace("{id}", "p120-a") + "?per_page=50";
    let (status, link, body) = get(&c, &first).await;
    assert_eq!(status, 200);
    assert_eq!(ks(&body), (0..50).collect::<Vec<_>>());
    assert_eq!(body[0], serde_json::json!({"id": "p120-a", "k": 0}));
    let link = link.unwrap();
    assert_eq!(
        link,
        r#"</pages/link/p120%2Da?page=2&per_page=50>; rel="next", </pages/link/p120%2Da?page=3&per_page=50>; rel="last""#
    );
    let (_, link, body) = get(
        &c,
        &format!("{base}/pages/link/p120%2Da?page=2&per_page=50"),
    )
    .await;
    assert_eq!(ks(&body), (50..100).collect::<Vec<_>>());
    assert!(link.unwrap().contains("page=3"));
    let (_, link, body) = get(&c, &format!("{base}/pages/link/p120-a?page=3&per_page=50")).await;
    assert_eq!(ks(&body), (100..120).collect::<Vec<_>>());
    assert!(!link.unwrap().contains("next"), "no next on the last page");
    assert_eq!(api.calls("p120-a"), 3, "each page is a call of the ID");
    api.shutdown().await;
}

#[tokio::test]
async fn cursor_pages_end_with_an_empty_cursor() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let url = api.pages_cursor_url_template().replace("{id}", "plain");
    let mut cursor = String::new();
    let mut seen = Vec::new();
    loop {
        let (status, link, body) = get(&c, &format!("{url}?cursor={cursor}")).await;
        assert_eq!(status, 200);
        assert!(link.is_none());
        seen.extend(ks(&body["data"]));
        cursor = body["next_cursor"].as_str().unwrap().to_string();
        assert_eq!(body["has_more"], !cursor.is_empty());
        if cursor.is_empty() {
            break;
        }
    }
    assert_eq!(
        seen,
        (0..120).collect::<Vec<_>>(),
        "the default count, 50 a page"
    );
    assert_eq!(api.calls("plain"), 3);
    let items: Vec<u64> = api
        .page_items("plain")
        .iter()
        .map(|i| i["k"].as_u64().unwrap())
        .collect();
    assert_eq!(items, seen);
    api.shutdown().await;
}

#[tokio::test]
async fn offset_pages_end_short_or_empty() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let url = api.pages_offset_url_template().replace("{id}", "p100-x");
    let (_, _, body) = get(&c, &format!("{url}?offset=50&limit=50")).await;
    assert_eq!(ks(&body), (50..100).collect::<Vec<_>>());
    let (_, _, body) = get(&c, &format!("{url}?offset=100&limit=50")).await;
    assert_eq!(
        ks(&body),
        Vec::<u64>::new(),
        "whole pages end with an empty one"
    );
    let (_, _, body) = get(&c, &format!("{url}?offset=90&limit=40")).await;
    assert_eq!(ks(&body), (90..100).collect::<Vec<_>>(), "a short page");
    let (_, _, body) = get(&c, &url).await;
    assert_eq!(ks(&body).len(), 50, "from 0, 50 a page unless told");
    api.shutdown().await;
}

#[tokio::test]
async fn malformed_page_requests_answer_400_and_are_no_call() {
    let api = FakeApi::start(ApiConfig::fast()).await.unwrap();
    let c = client();
    let base = format!("http://{}", api.addr());
    for bad in [
        "/pages/link/a?page=0",
        "/pages/link/a?page=x",
        "/pages/link/a?per_page=0",
        "/pages/link/a?per_page=100000",
        "/pages/cursor/a?cursor=zz",
        "/pages/offset/a?offset=-1",
        "/pages/offset/a?limit=%FF",
        "/pages/link/",
    ] {
        let resp = c.get(format!("{base}{bad}")).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{bad}");
    }
    let resp = c.get(format!("{base}/pages/other/a")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(api.calls("a"), 0);
    api.shutdown().await;
}
