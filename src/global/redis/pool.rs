//! The one connection pool type of global mode, [`RedisPool`], over the three deployments
//! (a standalone server, the master a Sentinel deployment names, a Redis Cluster), and
//! [`RedisPool::open`], the one place a Redis setting becomes its shards. The sync's store
//! and the exact rules' store each open their own pools from the same setting.
//!
//! A standalone or Sentinel connection leaves the pool on a connection error or `READONLY`
//! ([`PooledConn`]), so that after a failover new ones go to the new master; a cluster
//! connection follows the cluster's moves itself.

use deadpool::managed;
use deadpool_redis::redis::{self, aio::ConnectionLike, RedisError, Value};
use deadpool_redis::Runtime;

use super::conn::{
    cluster_client, connection_info, redact, sentinel_client, sentinel_name, RedisOptions,
    SentinelMaster,
};

/// A pool of connections to one shard of global mode.
pub(crate) enum RedisPool {
    /// A server at a fixed address.
    Single(deadpool_redis::Pool),
    /// The current master of a Sentinel deployment: each new connection asks the sentinels
    /// where the master is (and checks its role), so once a broken connection is dropped
    /// ([`PooledConn`]) the next one goes to the master the sentinels promoted.
    Sentinel(managed::Pool<SentinelManager>),
    /// A Redis Cluster: one client routing each key to its slot's master.
    Cluster(managed::Pool<ClusterManager>),
}

/// A connection of a [`RedisPool`]. A standalone or Sentinel call that fails on the
/// connection itself (I/O, refused, dropped) or is answered `READONLY` (the server was
/// demoted to a replica) marks it stale, and a stale connection is taken out of the pool
/// when dropped instead of going back: deadpool's recycle check is a `PING`, which a demoted
/// master still answers. A cluster connection always goes back: it reconnects and follows
/// `MOVED` on its own.
pub(crate) struct PooledConn {
    inner: Option<Inner>,
    stale: bool,
}

enum Inner {
    Single(deadpool_redis::Connection),
    Sentinel(managed::Object<SentinelManager>),
    Cluster(managed::Object<ClusterManager>),
}

/// One shard of a Redis setting: its name (for logs, metrics and routing, without
/// credentials) and its pool.
pub(crate) struct Shard {
    pub name: String,
    pub pool: RedisPool,
}

/// Why a shard's pool could not be opened (an unusable URL, say): the shard, named without
/// credentials ("cluster" for a Redis Cluster), and the cause.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The client could not be made from the URL(s).
    #[error("{shard}: {source}")]
    Client {
        /// The shard, without credentials.
        shard: String,
        /// Why.
        source: RedisError,
    },
    /// The pool could not be built.
    #[error("{shard}: {source}")]
    Build {
        /// The shard, without credentials.
        shard: String,
        /// Why.
        source: managed::BuildError,
    },
}

impl RedisPool {
    /// The shards of one Redis setting: a standalone server per URL, the master `sentinel`
    /// names found through the sentinels at the URLs, or the cluster reached through them
    /// (URLs normalized). Nothing is dialled until the first connection is wanted, so a Redis
    /// that is down at start only makes its shard degraded.
    ///
    /// # Errors
    /// When a URL is unusable.
    pub(crate) fn open(
        urls: &[String],
        cluster: bool,
        sentinel: Option<&SentinelMaster>,
        opts: &RedisOptions,
    ) -> Result<Vec<Shard>, OpenError> {
        Ok(match (cluster, sentinel) {
            (true, _) => vec![Shard {
                name: format!(
                    "cluster({})",
                    urls.iter().map(|s| redact(s)).collect::<Vec<_>>().join(",")
                ),
                pool: Self::cluster(urls, opts)?,
            }],
            (false, Some(master)) => vec![Shard {
                name: sentinel_name(urls, master),
                pool: Self::sentinel(urls, master, opts)?,
            }],
            (false, None) => urls
                .iter()
                .map(|u| {
                    Ok(Shard {
                        name: redact(u),
                        pool: Self::standalone(u, opts)?,
                    })
                })
                .collect::<Result<_, OpenError>>()?,
        })
    }

    /// A pool to the standalone Redis at `url` (normalized), `pool_size` connections.
    ///
    /// # Errors
    /// When the URL is unusable.
    pub(crate) fn standalone(url: &str, opts: &RedisOptions) -> Result<Self, OpenError> {
        let client = |source| OpenError::Client {
            shard: redact(url),
            source,
        };
        let info = connection_info(url, &opts.tls).map_err(client)?;
        let manager =
            deadpool_redis::Manager::new_with_config(info, connection_config()).map_err(client)?;
        deadpool_redis::Pool::builder(manager)
            .config(deadpool_redis::PoolConfig::new(opts.pool_size.max(1)))
            .runtime(Runtime::Tokio1)
            .build()
            .map(RedisPool::Single)
            .map_err(|source| OpenError::Build {
                shard: redact(url),
                source,
            })
    }

    /// A pool to the master `master` names, found through the sentinels at `sentinels`
    /// (normalized URLs, with the sentinels' credentials); the master's credentials are
    /// `opts.auth`.
    ///
    /// # Errors
    /// When the URLs are unusable.
    pub(crate) fn sentinel(
        sentinels: &[String],
        master: &SentinelMaster,
        opts: &RedisOptions,
    ) -> Result<Self, OpenError> {
        let shard = || sentinel_name(sentinels, master);
        let client =
            sentinel_client(sentinels, master, opts).map_err(|source| OpenError::Client {
                shard: shard(),
                source,
            })?;
        let manager = SentinelManager {
            client: tokio::sync::Mutex::new(client),
            pings: std::sync::atomic::AtomicUsize::new(0),
        };
        built(manager, opts)
            .map(RedisPool::Sentinel)
            .map_err(|source| OpenError::Build {
                shard: shard(),
                source,
            })
    }

    /// A pool to the Redis Cluster reached through `seeds` (normalized URLs).
    ///
    /// # Errors
    /// When the URLs are unusable.
    pub(crate) fn cluster(seeds: &[String], opts: &RedisOptions) -> Result<Self, OpenError> {
        // Named "cluster" alone: the seeds are not the shard, and may carry credentials.
        let shard = || "cluster".to_string();
        let client = cluster_client(seeds, opts).map_err(|source| OpenError::Client {
            shard: shard(),
            source,
        })?;
        let manager = ClusterManager {
            client,
            pings: std::sync::atomic::AtomicUsize::new(0),
        };
        built(manager, opts)
            .map(RedisPool::Cluster)
            .map_err(|source| OpenError::Build {
                shard: shard(),
                source,
            })
    }

    /// Whether the pool is a cluster's: a script call's keys must then share a slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, RedisPool::Cluster(_))
    }

    /// A connection, made if the pool has none idle.
    ///
    /// # Errors
    /// When no connection can be made (for Sentinel: no sentinel answers, or none names a
    /// master that answers as one).
    pub(crate) async fn get(&self) -> Result<PooledConn, managed::PoolError<RedisError>> {
        let inner = match self {
            RedisPool::Single(p) => Inner::Single(p.get().await?),
            RedisPool::Sentinel(p) => Inner::Sentinel(p.get().await?),
            RedisPool::Cluster(p) => Inner::Cluster(p.get().await?),
        };
        Ok(PooledConn {
            inner: Some(inner),
            stale: false,
        })
    }
}

impl PooledConn {
    fn conn(&mut self) -> &mut dyn ConnectionLike {
        match self.inner.as_mut().expect("present until dropped") {
            Inner::Single(c) => &mut **c,
            Inner::Sentinel(c) => &mut **c,
            Inner::Cluster(c) => &mut **c,
        }
    }

    /// A handle on a cluster connection for calls in flight at once (it multiplexes), or
    /// `None` for another pool's connection.
    pub(crate) fn cluster_handle(&self) -> Option<redis::cluster_async::ClusterConnection> {
        match self.inner.as_ref() {
            Some(Inner::Cluster(c)) => Some((**c).clone()),
            _ => None,
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.inner, Some(Inner::Cluster(_)))
    }

    /// Marks the connection stale when `e` says it, or its server, is no use any more.
    fn check_error(&mut self, e: &RedisError) {
        if is_stale(e) && !self.is_cluster() {
            self.stale = true;
        }
    }
}

/// Whether an error condemns the connection rather than the command: the connection broke,
/// or the server no longer takes writes (a master demoted by a failover).
fn is_stale(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.code() == Some("READONLY")
}

/// Whether a pipeline's reply (read with `ignore_errors`) is a `READONLY` refusal, a script's
/// write refused on a replica included.
fn is_readonly_reply(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => {
            e.code() == "READONLY" || e.details().is_some_and(|d| d.contains("READONLY"))
        }
        _ => false,
    }
}

impl ConnectionLike for PooledConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let r = self.conn().req_packed_command(cmd).await;
            if let Err(e) = &r {
                self.check_error(e);
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let r = self.conn().req_packed_commands(cmd, offset, count).await;
            match &r {
                Err(e) => self.check_error(e),
                Ok(vs) if !self.is_cluster() && vs.iter().any(is_readonly_reply) => {
                    self.stale = true
                }
                Ok(_) => {}
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        match self.inner.as_ref().expect("present until dropped") {
            Inner::Single(c) => c.get_db(),
            Inner::Sentinel(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if !self.stale {
            return;
        }
        // Taken out of the pool, the connection is closed here; the pool makes a new one
        // (asking the sentinels again) when next asked.
        match self.inner.take() {
            Some(Inner::Single(c)) => drop(deadpool_redis::Connection::take(c)),
            Some(Inner::Sentinel(c)) => drop(managed::Object::take(c)),
            Some(Inner::Cluster(c)) => drop(managed::Object::take(c)),
            None => {}
        }
    }
}

/// PING with a fresh argument: a connection that answers it is fit to go back to a caller.
async fn ping<C: ConnectionLike>(
    conn: &mut C,
    counter: &std::sync::atomic::AtomicUsize,
) -> managed::RecycleResult<RedisError> {
    let n = counter
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string();
    let back: String = redis::cmd("PING").arg(&n).query_async(conn).await?;
    if back == n {
        Ok(())
    } else {
        Err(managed::RecycleError::message("unexpected PING reply"))
    }
}

/// Connections to the master a Sentinel deployment names (deadpool-redis' own manager builds
/// its client without the master's TLS certificates).
pub(crate) struct SentinelManager {
    client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    pings: std::sync::atomic::AtomicUsize,
}

impl managed::Manager for SentinelManager {
    type Type = redis::aio::MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<Self::Type, RedisError> {
        let config = connection_config();
        let mut client = self.client.lock().await;
        client.get_async_connection_with_config(&config).await
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        ping(conn, &self.pings).await
    }
}

/// Connections to a Redis Cluster (deadpool-redis' own manager cannot give its client TLS
/// certificates).
pub(crate) struct ClusterManager {
    client: redis::cluster::ClusterClient,
    pings: std::sync::atomic::AtomicUsize,
}

impl managed::Manager for ClusterManager {
    type Type = redis::cluster_async::ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<Self::Type, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        ping(conn, &self.pings).await
    }
}

/// Connections without the client's own response timeout (500 ms by default): every call
/// has sluice's own around it (`REDIS_TIMEOUT` for the sync and exact rules), and the
/// client's would cut a call short of a longer `REDIS_TIMEOUT`.
fn connection_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new().set_response_timeout(None)
}

/// A pool of `opts.pool_size` (at least 1) connections from `manager`, on tokio (the
/// Sentinel and Cluster managers; deadpool-redis builds the standalone pool's own type).
fn built<M: managed::Manager>(
    manager: M,
    opts: &RedisOptions,
) -> Result<managed::Pool<M>, managed::BuildError> {
    managed::Pool::builder(manager)
        .config(managed::PoolConfig::new(opts.pool_size.max(1)))
        .runtime(Runtime::Tokio1)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_connections_and_demoted_masters_condemn_the_connection() {
        use redis::{ErrorKind, ServerErrorKind};
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_stale(&io));
        let readonly = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(is_stale(&readonly));
        // A command's own error leaves the connection in the pool.
        let wrongtype = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ));
        assert!(!is_stale(&wrongtype));
    }
}
