//! Redis's failures as the stores' callers see them: [`backend`] keeps the redis crate's
//! `ErrorKind` as a [`StoreErrorKind`], so a connection lost or a server loading reads as
//! transient and refused credentials or a script error do not.

use deadpool::managed::PoolError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::global::sync::store::{StoreError, StoreErrorKind};

/// A failure a Redis call can meet: the client's, the pool's, or a reply the call cannot
/// read (a message).
pub(crate) trait Failure: std::fmt::Display {
    /// Its kind.
    fn kind(&self) -> StoreErrorKind {
        StoreErrorKind::Reply
    }
}

impl Failure for String {}
impl Failure for &str {}

impl Failure for RedisError {
    fn kind(&self) -> StoreErrorKind {
        classify(self)
    }
}

impl Failure for PoolError<RedisError> {
    fn kind(&self) -> StoreErrorKind {
        match self {
            PoolError::Backend(e) => classify(e),
            PoolError::PostCreateHook(_) => StoreErrorKind::Connection,
            // Every connection busy, or the pool closing: both pass.
            PoolError::Timeout(_) | PoolError::Closed => StoreErrorKind::Unavailable,
            PoolError::NoRuntimeSpecified => StoreErrorKind::Other,
        }
    }
}

/// `e` as a store error, its kind kept.
pub(crate) fn backend(e: impl Failure) -> StoreError {
    StoreError::backend(e.kind(), e.to_string())
}

/// The kind of one redis crate error.
fn classify(e: &RedisError) -> StoreErrorKind {
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreErrorKind::Connection;
    }
    match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Connection,
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::NoValidReplicasFoundBySentinel => {
            StoreErrorKind::Unavailable
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreErrorKind::Unavailable,
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            StoreErrorKind::Auth
        }
        ErrorKind::InvalidClientConfig | ErrorKind::EmptySentinelList => StoreErrorKind::Other,
        _ => StoreErrorKind::Reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_transient_and_refused_credentials_are_not() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(backend(refused).kind(), StoreErrorKind::Connection);
        assert!(backend(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        )))
        .is_transient());
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "wrong password"));
        let e = backend(auth);
        assert_eq!(e.kind(), StoreErrorKind::Auth);
        assert!(!e.is_transient());
    }

    #[test]
    fn a_loading_server_is_transient_and_a_script_error_is_not() {
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(backend(loading).is_transient());
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "user_script:1: bad",
        ));
        let e = backend(script);
        assert_eq!(e.kind(), StoreErrorKind::Reply);
        assert!(!e.is_transient());
        let reply = backend(format!("unexpected script reply {:?}", 1));
        assert!(!reply.is_transient());
        assert_eq!(reply.to_string(), "unexpected script reply 1");
    }

    #[test]
    fn a_timeout_is_transient() {
        let e = StoreError::Timeout(std::time::Duration::from_millis(5));
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "timed out after 5ms");
    }
}
