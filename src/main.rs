/// Capture allocates and frees many small JSON values per event; mimalloc handles that pattern
/// far better than the system allocator (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (index 15 in both mimalloc v2's and v3's `mi_option_t`).
const MI_OPTION_PURGE_DELAY: std::os::raw::c_int = 15;

/// How long freed memory stays with the process before mimalloc returns it to the OS. Its
/// default, 10 ms, made capture fault the same pages back in many times a second (8 % of the
/// HTTP workers' time went to page faults; `/batch/` is 12–20 % faster with 1 s). With 1 s the
/// segment writer still faulted its column buffers back in after each flush, and every fault
/// on a page it had returned interrupted the other core to flush its TLB; with 10 s `/batch/`
/// is about 5 % faster again, at the same peak RSS (docs/PERFORMANCE.md). Memory not reused
/// for 10 s still goes back, so an idle server shrinks.
const PURGE_DELAY_MS: std::os::raw::c_long = 10_000;

/// Sets the allocator options above unless `MIMALLOC_PURGE_DELAY` asks for another value.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set only stores an integer option; any option value is valid and
        // it may be called at any time from any thread.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    corvid::cli::main()
}
