//! The appliance disk, shared by `cargo xtask image` (which writes disk.img) and PID 1 (which
//! reads the config partition, finds the data partition and writes update slots): the layout
//! from `image/layout.toml`, GUIDs, a byte-range view of a disk for the FAT code, FAT helpers,
//! the A/B slot names, the update signature and the Authenticode check (ADR 0024, 0025, 0051).
#![forbid(unsafe_code)]

pub mod authenticode;
pub mod fat;
pub mod gpt;
pub mod guid;
pub mod layout;
pub mod signature;
pub mod slice;
pub mod slots;

pub use guid::Guid;
pub use layout::{Layout, Partition, Role};
pub use slice::Slice;
