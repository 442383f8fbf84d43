//! The quota service as the fleet's presence exchange sees it (`global::PresenceSource`):
//! this replica's streams and demand per counter out, the other replicas' in. Their last
//! values are kept while the store does not answer: shares stay within what the fleet was
//! last known to hold rather than growing to the whole room.

use std::sync::Arc;

use crate::global::{Others, Presence, PresenceSource};

use super::engine::Quotas;
use super::share::Rest;

/// [`Quotas`] as a presence source.
pub struct Published(pub Arc<Quotas>);

impl PresenceSource for Published {
    fn local(&self) -> Vec<Presence> {
        let now = self.0.limiter().now();
        self.0
            .presence(now)
            .into_iter()
            .map(|(entity, streams, demand)| Presence {
                entity,
                streams,
                demand,
            })
            .collect()
    }

    fn others(&self, others: &[(u128, Others)]) {
        let rests: Vec<(u128, Rest)> = others
            .iter()
            .map(|(entity, o)| {
                let rest = Rest {
                    streams: o.streams,
                    demand: o.demand,
                };
                (*entity, rest)
            })
            .collect();
        self.0.set_rest(&rests);
    }
}
