//! `--data`: opening the data device before anything listens (format a blank one, refuse
//! foreign content, recover), warming RAM from it, and attaching it to the store.
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ringstore_config::{Config, DataFormat, DataFull, DataRecover};
use ringstore_durable::{DataKey, Durable, DurableError, FileDevice, Limits, Options, Serving};
use ringstore_store::{Fetched, Store};

use crate::clock::Clock;
use crate::durable::{DeviceBackfill, PENDING_WRITES_MAX};
use crate::RuntimeError;

/// Segment size for a new device: about 16 segments per region, between 256 KiB and 8 MiB,
/// and always large enough for one largest item.
fn segment_size(len: u64, regions: u32, item_size_max: usize) -> u64 {
    let per_region = len / u64::from(regions.max(1));
    let fit = (per_region / 16).clamp(256 << 10, 8 << 20);
    let fit = 1u64 << (63 - fit.leading_zeros());
    let item = (item_size_max as u64 + 64 * 1024).next_power_of_two();
    fit.max(item)
}

/// `--data-size`: a missing data file is created at `size` (sparse, mode 0600), a blank one
/// (as the data format probes a device it may format) smaller than `size` is extended. Refused: a
/// file larger than `size` (never shrunk), a formatted one smaller (its format does not grow
/// with the file), anything but a regular file. Returns the line to log when it changed one.
fn size_file(path: &Path, size: u64) -> Result<Option<String>, RuntimeError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let refused = |why: String| RuntimeError::DataRefused(format!("data-size: {shown}: {why}"));
    let meta = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| refused(format!("cannot create it: {e}")))?;
            file.set_len(size)
                .map_err(|e| refused(format!("cannot size it: {e}")))?;
            return Ok(Some(format!("data file {shown} created, {size} bytes")));
        }
        Err(e) => return Err(refused(e.to_string())),
        Ok(meta) => meta,
    };
    if !meta.is_file() {
        return Err(refused(
            "not a regular file (a block device's size is its own; drop data-size)".into(),
        ));
    }
    let len = meta.len();
    if len > size {
        return Err(refused(format!(
            "{len} bytes, larger than data-size {size}: a data file is never shrunk"
        )));
    }
    if len == size {
        return Ok(None);
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| refused(e.to_string()))?;
    // The data format's own test of a device it may format: anything but blank is refused.
    let mut head = Vec::new();
    (&mut file)
        .take(ringstore_durable::superblock::PROBE_LEN as u64)
        .read_to_end(&mut head)
        .map_err(|e| refused(e.to_string()))?;
    if ringstore_durable::superblock::probe(&head) != ringstore_durable::superblock::Probe::Blank {
        return Err(refused(format!(
            "holds data formatted for {len} bytes; growing a formatted data file is not supported: keep data-size at {len}"
        )));
    }
    file.set_len(size)
        .map_err(|e| refused(format!("cannot extend it: {e}")))?;
    Ok(Some(format!(
        "data file {shown} extended from {len} to {size} bytes"
    )))
}

/// Opens (formats or recovers) the device; fewer regions than CPUs caps the workers.
pub(crate) fn open(
    path: &Path,
    config: &Config,
    cpus: &mut Vec<usize>,
) -> Result<Durable<FileDevice>, RuntimeError> {
    let shown = path.display();
    if let Some(size) = config.data_size {
        if let Some(line) = size_file(path, size)? {
            eprintln!("ringstore: {line}");
        }
    }
    let dev = FileDevice::open(path)
        .map_err(|e| RuntimeError::DataRefused(format!("cannot open data device {shown}: {e}")))?;
    let regions = crate::sys::u32_of(cpus.len());
    let data_key = match &config.data_key {
        Some(file) => {
            Some(DataKey::from_file(file).map_err(|e| RuntimeError::DataRefused(e.to_string()))?)
        }
        None => None,
    };
    let opts = Options {
        data_key,
        regions,
        segment_size: segment_size(
            ringstore_durable::BlockDevice::len(&dev),
            regions,
            config.item_size_max,
        ),
        block_size: 4096,
        checkpoint_len: 0,
        force: config.data_format == DataFormat::Force,
        salvage: config.data_recover == DataRecover::Salvage,
        limits: Limits {
            max_pending_writes: PENDING_WRITES_MAX,
            ..Limits::default()
        },
    };
    let opened = match Durable::open(dev, &opts) {
        Err(e @ (DurableError::KeyReplaced | DurableError::WrongKey)) => {
            finish_rotation(path, config, opts).map_err(|_| e)
        }
        other => other,
    };
    let (mut durable, report) = opened.map_err(|e| refusal(e, &shown))?;
    for damage in &report.damaged {
        eprintln!(
            "ringstore: data device {shown}: SALVAGED past damage in acknowledged history at region {}, segment {}, byte {}: keys whose newest record was there may answer an older value or be missing",
            damage.region, damage.segment, damage.offset
        );
    }
    let g = durable.superblock().geometry;
    if (g.regions as usize) < cpus.len() {
        eprintln!(
            "ringstore: data device {shown} has {} regions: running {} workers instead of {}",
            g.regions,
            g.regions,
            cpus.len()
        );
        cpus.truncate(g.regions as usize);
    }
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let compactions = durable.maintain(now_unix).map_err(|e| {
        RuntimeError::Data(format!("data device {shown}: compaction at start: {e}"))
    })?;
    let how = if report.formatted {
        "formatted"
    } else if report.from_checkpoint {
        "recovered from the shutdown checkpoint"
    } else {
        "recovered by scanning the logs"
    };
    let sealed = if durable.crypt().is_some() {
        ", sealed with the data key"
    } else {
        ""
    };
    eprintln!(
        "ringstore: data device {shown}: {how}: {} objects, {} records scanned, {} regions x {} segments of {} KiB, {compactions} compactions, in {} ms{sealed}",
        report.live_objects,
        report.records_scanned,
        g.regions,
        g.segments_per_region,
        g.segment_size >> 10,
        report.elapsed.as_millis()
    );
    Ok(durable)
}

/// What a device that did not open means for the start: exit 2 (refused, the device as it
/// was) or a failure.
fn refusal(e: DurableError, shown: &std::path::Display<'_>) -> RuntimeError {
    match e {
        DurableError::ForeignSignature(_)
        | DurableError::NotBlank
        | DurableError::Version { .. }
        | DurableError::CorruptSuperblock(_)
        | DurableError::TooSmall { .. }
        | DurableError::KeyMissing
        | DurableError::KeyUnexpected
        | DurableError::WrongKey
        | DurableError::KeyReplaced
        | DurableError::KeyFile { .. }
        | DurableError::CorruptHistory { .. } => RuntimeError::DataRefused(format!(
            "data device {shown}: {}",
            e.to_string()
                .replace("use force", "use --data-format=force")
                .replace(
                    "the device is left untouched",
                    "the device is left untouched (--data-recover=salvage starts with what verifies)"
                )
        )),
        other => RuntimeError::Data(format!("data device {shown}: {other}")),
    }
}

/// `--data-key FILE` was refused: if a rekey to `FILE.next` became durable but its rename over
/// FILE did not happen (a crash right after the switch, ADR 0055), opens with `FILE.next` and
/// renames it. `Err`: it did not open either (the caller reports FILE's refusal).
fn finish_rotation(
    path: &Path,
    config: &Config,
    mut opts: Options,
) -> Result<(Durable<FileDevice>, ringstore_durable::OpenReport), DurableError> {
    let Some(file) = &config.data_key else {
        return Err(DurableError::KeyMissing);
    };
    let next = DataKey::next_file(file);
    if !next.exists() {
        return Err(DurableError::KeyMissing);
    }
    opts.data_key = Some(DataKey::from_file(&next)?);
    let dev = FileDevice::open(path).map_err(|e| DurableError::io(0, &e))?;
    let opened = Durable::open(dev, &opts)?;
    match DataKey::promote_next(file) {
        Ok(()) => eprintln!(
            "ringstore: data device: opened with {} (a rekey to it was durable) and renamed it to {}",
            next.display(),
            file.display()
        ),
        Err(e) => eprintln!(
            "ringstore: data device: opened with {} (a rekey to it was durable); renaming it to {} failed: {e}: rename it by hand",
            next.display(),
            file.display()
        ),
    }
    Ok(opened)
}

/// SIGHUP with `--data-key FILE` and a `FILE.next`: rekeys the data device to it, and once
/// the switch is durable renames `FILE.next` over `FILE` (ADR 0055). Each outcome is logged.
pub(crate) fn rekey_to_next(data: &Serving<FileDevice>, config: &Config) {
    let Some(file) = &config.data_key else { return };
    let next = DataKey::next_file(file);
    if !next.exists() {
        return;
    }
    let shown = next.display();
    let key = match DataKey::from_file(&next) {
        Ok(key) => key,
        Err(e) => return eprintln!("ringstore: data rekey: {e}"),
    };
    match data.rekey(key, None).map_err(|e| e.to_string()) {
        Err(why) => eprintln!("ringstore: data rekey to {shown}: {why}"),
        Ok(epoch) => {
            let renamed = match DataKey::promote_next(file) {
                Ok(()) => format!("{shown} renamed to {}", file.display()),
                Err(e) => format!(
                    "renaming {shown} to {} failed ({e}): rename it by hand (a start finds it either way)",
                    file.display()
                ),
            };
            eprintln!(
                "ringstore: data device rekeyed: new records sealed with the new key from epoch {epoch}; {renamed}; the old key stays in the superblock, sealed under the new one, until compaction rewrote every record under it"
            );
        }
    }
}

/// Loads the device's live values into RAM (as many as fit; the rest are read through on
/// demand), raises the CAS counter above every recovered value, attaches the read-through
/// to the store and makes it refuse writes that come without a worker's device handle.
pub(crate) fn attach(
    durable: Durable<FileDevice>,
    store: &Store,
    clock: Clock,
    data_full: DataFull,
) -> Arc<Serving<FileDevice>> {
    let started = Instant::now();
    // Store times of staged mutations are seconds since the clock started.
    let serving = Serving::new(durable).with_unix_start(clock.unix_start());
    let serving = Arc::new(serving.with_data_full(data_full));
    if serving.swept_chunks() > 0 {
        eprintln!(
            "ringstore: data device: dropped {} chunks of large objects no manifest names (uploads cut short)",
            serving.swept_chunks()
        );
    }
    let now = clock.now();
    let unix_start = clock.unix_start();
    let mut refused = 0usize;
    let (delivered, bad) = serving.for_each_value(now.unix, |key, item| {
        let exptime = if item.exptime == 0 {
            0
        } else {
            u32::try_from(
                item.exptime
                    .saturating_sub(unix_start)
                    .clamp(1, u64::from(u32::MAX)),
            )
            .unwrap_or(u32::MAX)
        };
        let fetched = Fetched {
            value: item.value,
            flags: item.flags,
            exptime,
            cas: item.cas,
            large: item.large,
        };
        if store.load(key, &fetched, now.store).is_err() {
            refused += 1;
        }
    });
    for _ in 0..bad {
        serving.note_corrupt();
    }
    serving.note_load_refused(refused as u64);
    store.raise_cas_floor(serving.max_cas());
    store.attach_backfill(Arc::new(DeviceBackfill {
        serving: serving.clone(),
        unix_start,
    }));
    // Every write now goes through a worker's device handle; one without (memcache over
    // UDP) is refused rather than kept in RAM alone.
    store.require_journal();
    let st = store.stats();
    eprintln!(
        "ringstore: data device: loaded {delivered} objects into RAM in {} ms ({} resident, {refused} refused, {bad} unreadable); misses read through",
        started.elapsed().as_millis(),
        st.curr_items
    );
    serving
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_fit_the_largest_item_and_scale_with_the_device() {
        assert_eq!(segment_size(16 << 20, 1, 1 << 20), 2 << 20);
        assert_eq!(segment_size(64 << 30, 8, 1 << 20), 8 << 20);
        assert_eq!(segment_size(64 << 20, 4, 1024), 1 << 20);
        assert!(segment_size(1 << 30, 2, 4 << 20) >= (4 << 20) + 4096);
    }
}
