//! Paginated jobs (`--paginate`): refused, with a usage error and nothing created, until the
//! engine follows pages; flags of paging that do not fit are refused the same way.

use highwater::demo::api::ApiConfig;

use crate::harness::*;

#[test]
fn a_paginated_run_is_refused_until_the_engine_follows_pages() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(5));
    let url = h.api.pages_link_url_template();
    let state = h.state();
    h.run_new(
        &state,
        &input,
        &url,
        &["--paginate", "link", "--items", ".[]"],
    )
    .expect_refused(2, &["--paginate is not available yet"]);
    assert!(!state.exists(), "nothing is created for a paginated job");
    // A job made without pages is not turned into one on resume either.
    h.run_new(&state, &input, &h.url(), &[]).expect_code(0);
    h.run_new(
        &state,
        &input,
        &url,
        &[
            "--paginate",
            "link",
            "--items",
            ".[]",
            "--allow-spec-change",
        ],
    )
    .expect_refused(2, &["--paginate is not available yet"]);
    assert_eq!(
        h.api.total_calls(),
        5,
        "only the unpaginated run called the API"
    );
}

#[test]
fn paging_flags_that_do_not_fit_are_usage_errors() {
    let h = Harness::new(ApiConfig::fast());
    let input = h.ids_file("ids.txt", &ids(3));
    let url = h.api.pages_cursor_url_template();
    for (flags, says) in [
        (
            &["--paginate", "cursor=.next_cursor", "--items", ".data[]"][..],
            "needs --page-param",
        ),
        (&["--paginate", "link"][..], "--paginate needs --items"),
        (&["--items", ".[]"][..], "--items goes with --paginate"),
        (
            &["--paginate", "link", "--items", ".[]", "--extract", ".a"][..],
            "does not go with --extract",
        ),
        (
            &["--paginate", "link", "--items", ".data["][..],
            "--items \".data[\" is not a valid jq program",
        ),
    ] {
        let state = h.path(&format!("state-{}", says.len()));
        h.run_new(&state, &input, &url, flags)
            .expect_refused(2, &[says]);
        assert!(!state.exists(), "{flags:?}");
    }
    assert_eq!(h.api.total_calls(), 0);
}
