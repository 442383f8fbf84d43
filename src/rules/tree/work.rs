//! The bytes of request values a lookup examines, counted in tests only: the bound on a
//! lookup's work is asserted on this count, not on a clock.

#[cfg(test)]
thread_local!(static BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });

/// Counts `n` bytes examined (a no-op outside tests).
#[inline(always)]
pub(crate) fn add(n: u64) {
    #[cfg(test)]
    BYTES.with(|b| b.set(b.get() + n));
    #[cfg(not(test))]
    let _ = n;
}

/// The count so far on this thread, reset to zero.
#[cfg(test)]
pub(crate) fn take() -> u64 {
    BYTES.with(|b| b.replace(0))
}
