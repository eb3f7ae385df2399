//! The `highwater` binary: everything lives in the library; this only hands over to the CLI.

/// jemalloc, not the system allocator: a run allocates and frees small buffers on many
/// threads (sled pages, HTTP bodies, records) all day. jemalloc does that about 15-20%
/// faster than glibc malloc here, and from a few million IDs on holds less memory than
/// glibc's per-thread arenas (README, Performance: "Allocator"). The library leaves the
/// choice to its users.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Return the freed pages of every jemalloc arena to the system now (`arena.<all>.purge`).
/// The store calls it when it reopens its database (see
/// `highwater::store::sled_store::set_release_memory_hook`); measured in README, Performance.
fn purge_jemalloc() {
    // MALLCTL_ARENAS_ALL = 4096: every arena.
    let name = c"arena.4096.purge";
    // SAFETY: a documented mallctl that takes and returns nothing; the name is a valid C string.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

fn main() -> std::process::ExitCode {
    highwater::store::sled_store::set_release_memory_hook(purge_jemalloc);
    highwater::cli::main()
}
