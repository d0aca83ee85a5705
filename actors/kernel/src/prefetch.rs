//! Asking the CPU to start loading memory a loop will read a few iterations later.
//!
//! A pass over rows that other threads allocated, in an order unrelated to where they sit in
//! memory (a segment's rows sorted by event and time), spends much of its time waiting for
//! each row's first cache line. Naming the rows a few iterations ahead lets those loads
//! overlap the work on the current row. A prefetch is only a hint: it never faults, changes
//! no memory and is correct to drop, so on other architectures these functions do nothing.

/// Bytes of one cache line on the machines this runs on.
const LINE: usize = 64;

/// Starts loading the cache line holding `address` into every cache level.
#[inline(always)]
pub fn line<T: ?Sized>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: PREFETCHT0 is a hint that never faults, whatever the address, and reads or
    // writes nothing the program sees; SSE, which provides it, is part of every x86-64 CPU.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Starts loading the first `max` bytes of `bytes` (all of it when shorter), a line at a time.
#[inline]
pub fn bytes(bytes: &[u8], max: usize) {
    let end = bytes.len().min(max);
    let start = bytes.as_ptr();
    let mut at = 0;
    while at < end {
        line(start.wrapping_add(at));
        at += LINE;
    }
}

/// Starts loading all of `value` (its own bytes, not what it points to).
#[inline]
pub fn value<T>(value: &T) {
    let start = (value as *const T).cast::<u8>();
    let mut at = 0;
    while at < std::mem::size_of::<T>() {
        line(start.wrapping_add(at));
        at += LINE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_changes_nothing_it_names() {
        let text = "x".repeat(1000);
        let row = [7u64; 40];
        bytes(text.as_bytes(), 512);
        bytes(b"", 512);
        value(&row);
        line(std::ptr::null::<u8>());
        assert_eq!(text, "x".repeat(1000));
        assert_eq!(row, [7u64; 40]);
    }
}
