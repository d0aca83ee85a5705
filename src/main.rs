fn main() -> std::process::ExitCode {
    corvid::cli::main()
}
