//! The operator console's protocol, shared by PID 1 (the box) and `ringstore console` (the host):
//! login by SSH-key challenge/response or password (`login`), the `@json` answer framing
//! (`frame`), the console stream split from the kernel's records (`split`) and the client that
//! logs in and runs one command (`client`). ADR-0023, docs/CONSOLE.md.
#![forbid(unsafe_code)]

pub mod client;
pub mod frame;
pub mod login;
pub mod split;

pub use frame::{FrameError, SCHEMA};
pub use login::{
    AuthError, AuthorizedKeys, Backoff, Challenge, Identity, KeyInfo, PasswordHash, NAMESPACE,
};

/// The console's prompt, printed after every answer.
pub const PROMPT: &str = "ringstore> ";
/// The prompt of a login's paste phase.
pub const SIGNATURE_PROMPT: &str = "signature: ";
/// The prompt of a password login.
pub const PASSWORD_PROMPT: &str = "password: ";
