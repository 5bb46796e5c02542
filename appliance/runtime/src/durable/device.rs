//! The data device as the service sees it: [`ConnDevice`], a worker's log on behalf of one
//! connection for one session call (the store's journal, large-object chunks, chunk reads),
//! and [`DeviceBackfill`], the store's reads of keys RAM does not hold.

use super::*;

/// The data device for one session call: the worker's log, on behalf of one connection.
pub(crate) struct ConnDevice<'a> {
    pub(super) device: &'a DeviceWorker,
    pub(super) conn: (u32, u32),
}

impl Journal for ConnDevice<'_> {
    fn record(&self, m: Mutation<'_>) -> Result<(), StoreError> {
        let serving = &self.device.serving;
        self.device
            .stage(Some(self.conn), |log, token| serving.stage(log, m, token))
    }
}

impl Device for ConnDevice<'_> {
    fn staged(&self) -> u64 {
        self.device.log.borrow().staged
    }

    fn chunk_len(&self) -> usize {
        self.device.serving.chunk_len()
    }

    fn region_len(&self) -> u64 {
        self.device.serving.region_len()
    }

    fn new_object_id(&self) -> u64 {
        self.device.serving.next_object_id()
    }

    fn stage_chunk(&self, object: u64, index: u32, bytes: &[u8]) -> Result<(), StoreError> {
        let serving = &self.device.serving;
        self.device.stage(Some(self.conn), |log, token| {
            serving.stage_chunk(log, object, index, bytes, token)
        })
    }

    fn abandon_object(&self, object: u64, chunks: u32) {
        let mut w = self.device.log.borrow_mut();
        if w.recs.is_empty() {
            self.device.serving.abandon_object(object, chunks);
        } else {
            let token = w.staged;
            w.abandoned.push_back((token, object, chunks));
        }
    }

    fn read_chunk(&self, object: u64, index: u32) -> Option<Vec<u8>> {
        let serving = &self.device.serving;
        serving
            .read_chunk(object, index)
            .map_err(|err| {
                note_read_error(serving, &err);
                eprintln!("ringstore: data device: chunk {index} of object {object}: {err}")
            })
            .ok()
    }

    fn read_chunk_range(
        &self,
        object: u64,
        index: u32,
        start: usize,
        end: usize,
    ) -> Option<Vec<u8>> {
        let serving = &self.device.serving;
        serving
            .read_chunk_range(object, index, start, end)
            .map_err(|err| {
                note_read_error(serving, &err);
                eprintln!(
                    "ringstore: data device: chunk {index} of object {object} \
                     bytes {start}..{end}: {err}"
                )
            })
            .ok()
    }

    fn stats(&self, out: &mut dyn FnMut(&'static str, u64)) {
        let serving = &self.device.serving;
        let (uploads, reserved) = serving.uploads();
        out("data_reserved_bytes", reserved);
        out("data_uploads_in_progress", uploads as u64);
        out("data_corrupt_records", serving.corrupt_records());
        // memcached extstore's names for what a full device evicted (ADR 0039).
        let ev = serving.evictions();
        out("extstore_objects_evicted", ev.objects);
        out("extstore_bytes_evicted", ev.bytes);
        out("extstore_page_evictions", ev.segments);
    }

    fn evictions(&self) -> u64 {
        self.device.serving.evictions().objects
    }

    fn commit_metrics(&self) -> Option<&ringstore_durable::CommitMetrics> {
        Some(self.device.serving.commit_metrics())
    }
}

/// Counts a damaged record read (`stats data_corrupt_records`).
fn note_read_error(serving: &Serving<FileDevice>, err: &ringstore_durable::DurableError) {
    if matches!(err, ringstore_durable::DurableError::Corrupt { .. }) {
        serving.note_corrupt();
    }
}

/// Reads RAM misses from the device (synchronous pread on the calling worker; see ADR 0011).
pub(crate) struct DeviceBackfill {
    pub serving: Arc<Serving<FileDevice>>,
    pub unix_start: u64,
}

impl Backfill for DeviceBackfill {
    fn fetch(&self, key: &[u8], now: Time) -> Option<Fetched> {
        let now_unix = self.unix_start + u64::from(now);
        match self.serving.lookup(key, now_unix) {
            Ok(Some(item)) => Some(Fetched {
                value: item.value,
                flags: item.flags,
                exptime: if item.exptime == 0 {
                    0
                } else {
                    Time::try_from(
                        item.exptime
                            .saturating_sub(self.unix_start)
                            .clamp(1, u64::from(u32::MAX)),
                    )
                    .unwrap_or(Time::MAX)
                },
                cas: item.cas,
                large: item.large,
            }),
            Ok(None) => None,
            Err(err) => {
                note_read_error(&self.serving, &err);
                eprintln!("ringstore: data device read failed: {err}");
                None
            }
        }
    }
}
