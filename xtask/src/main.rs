//! Project automation entry point: `cargo xtask test|run|image|bench`.
fn main() {}
