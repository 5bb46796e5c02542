//! The disk layout as data: `image/layout.toml` (compiled in), parsed into partitions, and
//! placed onto a disk of a given size (1 MiB-aligned starts, the last one may take the rest).

use crate::guid::{Guid, GuidError};

/// The repository's layout, the one disk.img is written with and PID 1 looks up.
pub const LAYOUT_TOML: &str = include_str!("../../../image/layout.toml");

/// What a partition is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Esp,
    Config,
    Data,
}

/// The FAT variant a partition is formatted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatKind {
    Fat12,
    Fat16,
    Fat32,
}

/// A partition's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Mib(u64),
    /// Whatever the disk leaves (only the last partition).
    Rest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub role: Role,
    /// The GPT partition name.
    pub name: String,
    pub type_guid: Guid,
    pub size: Size,
    /// Formatted as FAT with this label, or left zeroed (`None`).
    pub fat: Option<(FatKind, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub sector_size: u64,
    pub align_mib: u64,
    pub disk_size_mib: u64,
    pub partitions: Vec<Partition>,
}

/// A partition placed on a disk: sectors `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub first: u64,
    pub last: u64,
}

impl Placed {
    pub fn byte_range(&self, sector_size: u64) -> (u64, u64) {
        (
            self.first * sector_size,
            (self.last + 1 - self.first) * sector_size,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("layout: {0}")]
    Toml(String),
    #[error("layout: {0}")]
    Field(String),
    #[error("layout: {0}")]
    Guid(#[from] GuidError),
    #[error("disk of {disk_mib} MiB is too small: the layout needs {need_mib} MiB")]
    TooSmall { disk_mib: u64, need_mib: u64 },
}

/// GPT's primary header and 128 entries take LBA 0..=33; the backup the last 33 sectors.
const GPT_SECTORS: u64 = 34;

impl Layout {
    /// The compiled-in `image/layout.toml` (a unit test proves it parses).
    pub fn builtin() -> Layout {
        match Layout::parse(LAYOUT_TOML) {
            Ok(layout) => layout,
            Err(err) => unreachable!("image/layout.toml is checked by a unit test: {err}"),
        }
    }

    pub fn parse(text: &str) -> Result<Layout, LayoutError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| LayoutError::Toml(e.message().to_string()))?;
        let field = |what: &str| LayoutError::Field(what.to_string());
        let int = |t: &toml::Table, key: &str| -> Result<u64, LayoutError> {
            t.get(key)
                .and_then(|v| v.as_integer())
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| field(&format!("{key} must be a non-negative integer")))
        };
        let text_of = |t: &toml::Table, key: &str| -> Result<String, LayoutError> {
            t.get(key)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| field(&format!("{key} must be a string")))
        };
        let sector_size = int(&table, "sector_size")?;
        if sector_size != 512 && sector_size != 4096 {
            return Err(field("sector_size must be 512 or 4096"));
        }
        let mut partitions = Vec::new();
        let list = table
            .get("partition")
            .and_then(|v| v.as_array())
            .ok_or_else(|| field("no [[partition]] entries"))?;
        for (i, entry) in list.iter().enumerate() {
            let t = entry
                .as_table()
                .ok_or_else(|| field("[[partition]] must be a table"))?;
            let role = match text_of(t, "role")?.as_str() {
                "esp" => Role::Esp,
                "config" => Role::Config,
                "data" => Role::Data,
                other => return Err(field(&format!("unknown role {other:?}"))),
            };
            if partitions.iter().any(|p: &Partition| p.role == role) {
                return Err(field(&format!("role {role:?} given twice")));
            }
            let size = match t.get("size_mib") {
                Some(toml::Value::String(s)) if s == "rest" => {
                    if i + 1 != list.len() {
                        return Err(field("only the last partition may be \"rest\""));
                    }
                    Size::Rest
                }
                _ => Size::Mib(int(t, "size_mib")?.max(1)),
            };
            let fat = match t.get("fat").and_then(|v| v.as_str()) {
                None => None,
                Some(kind) => {
                    let kind = match kind {
                        "fat12" => FatKind::Fat12,
                        "fat16" => FatKind::Fat16,
                        "fat32" => FatKind::Fat32,
                        other => return Err(field(&format!("unknown fat {other:?}"))),
                    };
                    let label = text_of(t, "label")?;
                    if label.len() > 11 || !label.is_ascii() {
                        return Err(field("a FAT label is at most 11 ASCII characters"));
                    }
                    Some((kind, label))
                }
            };
            let name = text_of(t, "name")?;
            if name.encode_utf16().count() > 36 {
                return Err(field("a GPT partition name is at most 36 UTF-16 units"));
            }
            partitions.push(Partition {
                role,
                name,
                type_guid: Guid::parse(&text_of(t, "type")?)?,
                size,
                fat,
            });
        }
        Ok(Layout {
            sector_size,
            align_mib: int(&table, "align_mib")?.max(1),
            disk_size_mib: int(&table, "disk_size_mib")?,
            partitions,
        })
    }

    pub fn by_role(&self, role: Role) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.role == role)
    }

    /// Where each partition lies on a disk of `disk_bytes`.
    pub fn place(&self, disk_bytes: u64) -> Result<Vec<Placed>, LayoutError> {
        let mib = 1 << 20;
        let per_mib = mib / self.sector_size;
        let align = self.align_mib * per_mib;
        let sectors = disk_bytes / self.sector_size;
        let last_usable = sectors.saturating_sub(GPT_SECTORS);
        let fixed: u64 = self
            .partitions
            .iter()
            .map(|p| match p.size {
                Size::Mib(n) => n,
                Size::Rest => 1,
            })
            .sum();
        let too_small = LayoutError::TooSmall {
            disk_mib: disk_bytes / mib,
            need_mib: fixed + 2 * self.align_mib,
        };
        let mut next = GPT_SECTORS.div_ceil(align) * align;
        let mut placed = Vec::new();
        for p in &self.partitions {
            let first = next.div_ceil(align) * align;
            let last = match p.size {
                Size::Mib(n) => first + n * per_mib - 1,
                Size::Rest => last_usable.saturating_sub(1),
            };
            if last >= last_usable || last < first {
                return Err(too_small);
            }
            placed.push(Placed { first, last });
            next = last + 1;
        }
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_layout_parses_and_places() {
        let layout = Layout::builtin();
        assert_eq!(layout.sector_size, 512);
        let esp = layout.by_role(Role::Esp).unwrap();
        assert_eq!(
            esp.type_guid.to_string(),
            "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
        );
        assert!(layout.by_role(Role::Config).is_some());
        assert_eq!(layout.by_role(Role::Data).unwrap().size, Size::Rest);
        let placed = layout.place(layout.disk_size_mib << 20).unwrap();
        assert_eq!(placed[0].first, 2048);
        for pair in placed.windows(2) {
            assert!(pair[1].first > pair[0].last);
            assert_eq!(pair[1].first % 2048, 0);
        }
        let disk_sectors = (layout.disk_size_mib << 20) / 512;
        assert!(placed.last().unwrap().last < disk_sectors - 33);
    }

    #[test]
    fn a_disk_too_small_is_refused_with_what_it_needs() {
        let err = Layout::builtin().place(32 << 20).unwrap_err();
        assert!(
            matches!(err, LayoutError::TooSmall { disk_mib: 32, .. }),
            "{err}"
        );
    }

    #[test]
    fn bad_layouts_name_the_field() {
        let good = LAYOUT_TOML;
        for (from, to, want) in [
            ("sector_size = 512", "sector_size = 500", "sector_size"),
            ("role = \"esp\"", "role = \"data\"", "twice"),
            ("role = \"esp\"", "role = \"swap\"", "unknown role"),
            ("size_mib = 64", "size_mib = \"rest\"", "only the last"),
            (
                "label = \"RINGSTORE\"",
                "label = \"RINGSTORE-TOO-LONG\"",
                "11 ASCII",
            ),
            ("fat = \"fat32\"", "fat = \"ntfs\"", "unknown fat"),
            (
                "type = \"c12a7328-f81f-11d2-ba4b-00a0c93ec93b\"",
                "type = \"esp\"",
                "invalid GUID",
            ),
        ] {
            let text = good.replacen(from, to, 1);
            assert_ne!(text, good, "{from} not in the layout");
            let err = Layout::parse(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{from} → {to}: {err}");
        }
        assert!(Layout::parse("sector_size = [").is_err());
    }
}
