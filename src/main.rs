//! The `highwater` binary: everything lives in the library; this only hands over to the CLI.

/// jemalloc, not the system allocator: a run allocates and frees small buffers on many
/// threads (sled pages, HTTP bodies, records) all day. jemalloc does that about 15-20%
/// faster than glibc malloc here, and from a few million IDs on holds less memory than
/// glibc's per-thread arenas (README, Performance: "Allocator"). The library leaves the
/// choice to its users.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    highwater::cli::main()
}
