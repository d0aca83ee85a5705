/// Capture allocates and frees many small JSON values per event; mimalloc handles that pattern
/// far better than the system allocator (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    corvid::cli::main()
}
