//! The bench binary: `ringstore-bench [FLAGS]` is the run `cargo xtask bench [FLAGS]` starts;
//! `ringstore-bench floor ...` is the floor server the memcache cells start (floor.rs);
//! `ringstore-bench load ...` the load generator by hand against a running server (load.rs).

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((command, rest)) if command == "floor" => ringstore_bench::floor::main(rest),
        Some((command, rest)) if command == "load" => ringstore_bench::load::main(rest),
        _ => ringstore_bench::run(&args),
    }
}
