//! CPU hints that change nothing a program computes: a cache prefetch for reads coming soon.

/// Asks the CPU to start loading the cache line that holds `*r`, so a read of it a little
/// later does not wait for memory (a pipelined batch's index buckets and items, ADR 0038).
/// A hint only: nothing is read that the program sees, it cannot fault, and it compiles to
/// nothing on targets without one.
#[inline]
pub fn prefetch_read<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 has no architectural effect (no value is read, no fault is raised
    // whatever the address), and `r` is a live reference in any case.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            std::ptr::from_ref(r).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_leaves_the_value_as_it_was() {
        let words = vec![7u64; 1024];
        for w in &words {
            prefetch_read(w);
        }
        assert!(words.iter().all(|&w| w == 7));
    }
}
