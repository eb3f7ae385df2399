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
