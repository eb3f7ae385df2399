//! Tests of the command line's value parsers.

use super::args::byte_size;

#[test]
fn byte_sizes_parse_with_and_without_units() {
    assert_eq!(byte_size("64MiB"), Ok(64 << 20));
    assert_eq!(byte_size("512KiB"), Ok(512 << 10));
    assert_eq!(byte_size("2G"), Ok(2 << 30));
    // The guide's way to turn reopening off (docs/jobs.md).
    assert_eq!(byte_size("1TiB"), Ok(1 << 40));
    assert_eq!(byte_size("4096"), Ok(4096));
    assert_eq!(byte_size(" 16 K "), Ok(16 << 10));
    for bad in [
        "",
        "MiB",
        "0",
        "0MiB",
        "1.5MiB",
        "64MB",
        "-1",
        "99999999999999G",
        "99999999999T",
        "1PiB",
    ] {
        assert!(byte_size(bad).is_err(), "{bad:?} accepted");
    }
}

/// The job request `run` makes of `flags` (after `--state s --url u`), or its usage error.
fn run_request(flags: &[&str]) -> Result<crate::job::JobRequest, String> {
    use clap::Parser;
    let mut argv = vec!["highwater", "run", "--state", "s", "--url", "http://x/{id}"];
    argv.extend_from_slice(flags);
    let cli = super::args::Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    match cli.command {
        super::args::Command::Run(args) => args.request(),
        _ => unreachable!("a run"),
    }
}

#[test]
fn paging_flags_make_the_jobs_paginate_spec() {
    use crate::handler::paginate::{PageStyle, PaginateSpec, ParamPlace, DEFAULT_MAX_PAGES};
    let request = run_request(&["--paginate", "link", "--items", ".[]"]).unwrap();
    assert_eq!(
        request.paginate,
        Some(PaginateSpec {
            style: PageStyle::Link,
            items: ".[]".into(),
            max_pages: DEFAULT_MAX_PAGES,
        })
    );
    let request = run_request(&[
        "--paginate",
        "page",
        "--page-param",
        "body:page.number",
        "--page-start",
        "0",
        "--page-size",
        "100",
        "--items",
        ".data[]",
        "--max-pages",
        "7",
    ])
    .unwrap();
    assert_eq!(
        request.paginate,
        Some(PaginateSpec {
            style: PageStyle::Page {
                param: ParamPlace::Body("page.number".into()),
                start: 0,
                size: Some(100),
            },
            items: ".data[]".into(),
            max_pages: 7,
        })
    );
    assert_eq!(run_request(&[]).unwrap().paginate, None);
}

#[test]
fn paging_flags_that_do_not_fit_are_refused() {
    let refused = |flags: &[&str]| run_request(flags).unwrap_err();
    let e = refused(&["--paginate", "link"]);
    assert!(e.contains("--paginate needs --items"), "{e}");
    let e = refused(&["--items", ".[]", "--max-pages", "3"]);
    assert_eq!(e, "--items, --max-pages go with --paginate STYLE");
    let e = refused(&["--paginate", "cursor=.next", "--items", ".[]"]);
    assert!(
        e.contains("needs page_param") || e.contains("needs --page-param"),
        "{e}"
    );
    let e = refused(&[
        "--paginate",
        "link",
        "--items",
        ".[]",
        "--extract",
        ".a",
        "--keep-body",
    ]);
    assert!(e.contains("does not go with --extract"), "{e}");
    assert!(e.contains("--keep-body"), "{e}");
    let e = refused(&[
        "--paginate",
        "link",
        "--items",
        ".[]",
        "--batch-size",
        "5",
        "--split",
        ".[]",
    ]);
    assert!(e.contains("does not go with --batch-size"), "{e}");
    let e = refused(&["--paginate", "link", "--items", ".[", "--max-pages", "2"]);
    assert!(e.contains("not a valid jq program"), "{e}");
    let e = refused(&["--paginate", "link", "--items", ".[]", "--max-pages", "0"]);
    assert!(e.contains("at least 1"), "{e}");
    let e = refused(&["--paginate", "pages", "--items", ".[]"]);
    assert!(e.contains("not a style of paging"), "{e}");
}
