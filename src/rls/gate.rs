//! The gate every request passes: open while serving, closed for good at shutdown, and
//! `close` waits for the requests inside, so a final flush that follows it sees every hit
//! this process counts (ARCHITECTURE.md, "Invariants": no counted hit is lost on a clean shutdown). The servers'
//! own drain is not enough: a connection task can outlive its server when the grace runs out.

use std::sync::atomic::{AtomicU64, Ordering};

/// Set once closed; the low bits count requests inside.
const CLOSED: u64 = 1 << 63;

/// Open until [`Gate::close`].
#[derive(Debug, Default)]
pub(super) struct Gate(AtomicU64);

/// A request inside the gate; leaving drops it.
pub(super) struct Inside<'a>(&'a Gate);

impl Gate {
    /// Enters, unless closed.
    pub(super) fn enter(&self) -> Option<Inside<'_>> {
        if self.0.fetch_add(1, Ordering::Acquire) & CLOSED != 0 {
            self.0.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(Inside(self))
    }

    /// Closes the gate and waits for the requests inside to leave (each takes microseconds:
    /// a decision never awaits).
    pub(super) fn close(&self) {
        self.0.fetch_or(CLOSED, Ordering::AcqRel);
        while self.0.load(Ordering::Acquire) & !CLOSED != 0 {
            std::thread::yield_now();
        }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_refuses_and_close_waits_for_those_inside() {
        let gate = std::sync::Arc::new(Gate::default());
        let inside = gate.enter().unwrap();
        let (g, done) = (gate.clone(), std::sync::Arc::new(AtomicU64::new(0)));
        let d = done.clone();
        let closer = std::thread::spawn(move || {
            g.close();
            d.store(1, Ordering::SeqCst);
        });
        // Closing has begun or will: new requests are refused once it has, and close cannot
        // return while `inside` is held.
        while gate.enter().is_some() {
            std::thread::yield_now();
        }
        assert_eq!(
            done.load(Ordering::SeqCst),
            0,
            "close returned with a request inside"
        );
        drop(inside);
        closer.join().unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert!(gate.enter().is_none());
    }
}
