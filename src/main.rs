//! The `highwater` binary: everything lives in the library; this only hands over to the CLI.

/// jemalloc, not the system allocator: a run allocates and frees small buffers on many
/// threads (sled pages, HTTP bodies, records) all day. jemalloc does that about 15-20%
/// faster than glibc malloc here, and from a few million IDs on holds less memory than
/// glibc's per-thread arenas (benches/README.md, "Allocator"). The library leaves the
/// choice to its users.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options (its `malloc_conf`). `tcache_gc_incr_bytes`: a thread's cache
/// is garbage-collected after every 1 MiB it allocates instead of every 64 KiB. Each item
/// allocates a few KiB (the request, its headers, the answer, the record), so at the default
/// the collection ran every few items: about 3,000 instructions per item, 3% of the process
/// (callgrind against nginx; benches/README.md, "CPU per item").
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: it points at a constant string that lives for the whole program.
unsafe impl Sync for MallocConf {}

// SAFETY: jemalloc reads this symbol (its prefixed `malloc_conf`) as a C string once, at
// its first allocation; nothing else has that name.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf = MallocConf(c"tcache_gc_incr_bytes:1048576".as_ptr());

/// Return the freed pages of every jemalloc arena to the system now (`arena.<all>.purge`).
/// The store calls it when it reopens its database (see
/// `highwater::store::sled_store::set_release_memory_hook`); measured in benches/README.md,
/// "Allocator".
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
