//! The `ringstore` binary: dispatches to `serve` (a host process) or `init` (PID 1 of the appliance).
fn main() {}
