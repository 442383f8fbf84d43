//! The open quota streams as the status page lists them (`/status.json`): each stream's
//! domain and bucket count, registered when it opens and gone when it closes.
//!
//! Kept beside the streams, not read from them: a stream's state is its task's alone (no
//! lock), so each stream publishes these two facts through an [`Entry`] it shares with the
//! listing: a relaxed store per report or refresh, and the listing's lock only at open and
//! close. Bucket ids are not listed: their values are the requests' descriptor values.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::Serialize;

/// What one open stream publishes.
#[derive(Debug, Default)]
pub struct Entry {
    /// Its domain, once its first report named it.
    domain: OnceLock<String>,
    /// Its buckets tracked.
    buckets: AtomicUsize,
}

impl Entry {
    /// Records the stream's domain (the first one given stays: a stream's domain is fixed
    /// by its first report).
    pub fn set_domain(&self, domain: &str) {
        let _ = self.domain.set(domain.to_string());
    }

    /// Records the stream's bucket count.
    pub fn set_buckets(&self, n: usize) {
        self.buckets.store(n, Ordering::Relaxed);
    }
}

/// One stream as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamSummary {
    /// Its number on this replica, in order of opening.
    pub id: u64,
    /// Its domain (empty before its first report).
    pub domain: String,
    /// Its buckets tracked.
    pub buckets: usize,
}

/// The open streams, by number.
#[derive(Debug, Default)]
pub struct Listing {
    open: Mutex<BTreeMap<u64, Arc<Entry>>>,
}

impl Listing {
    /// Registers stream `id`: the entry it publishes through.
    pub fn open(&self, id: u64) -> Arc<Entry> {
        let e = Arc::new(Entry::default());
        self.open.lock().insert(id, e.clone());
        e
    }

    /// Takes stream `id` out.
    pub fn close(&self, id: u64) {
        self.open.lock().remove(&id);
    }

    /// The first `max` open streams, oldest first, and how many more are open.
    pub fn list(&self, max: usize) -> (Vec<StreamSummary>, usize) {
        let open = self.open.lock();
        let listed: Vec<StreamSummary> = open
            .iter()
            .take(max)
            .map(|(id, e)| StreamSummary {
                id: *id,
                domain: e.domain.get().cloned().unwrap_or_default(),
                buckets: e.buckets.load(Ordering::Relaxed),
            })
            .collect();
        let more = open.len() - listed.len();
        (listed, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_open_streams_oldest_first_up_to_the_cap() {
        let l = Listing::default();
        let a = l.open(1);
        a.set_domain("d");
        a.set_domain("other");
        a.set_buckets(3);
        l.open(2);
        l.open(3);
        let (listed, more) = l.list(2);
        assert_eq!(
            listed,
            vec![
                StreamSummary {
                    id: 1,
                    domain: "d".into(),
                    buckets: 3
                },
                StreamSummary {
                    id: 2,
                    domain: String::new(),
                    buckets: 0
                },
            ]
        );
        assert_eq!(more, 1);
        l.close(1);
        let (listed, more) = l.list(2);
        assert_eq!((listed[0].id, listed.len(), more), (2, 2, 0));
    }
}
