//! Connections to Redis: the settings every shard shares ([`RedisOptions`]), URLs in the
//! reference's forms with auth and TLS folded in ([`normalize_url`]), secrets kept out of names
//! ([`redact`]), and the connection pools of standalone shards, of a master found through
//! Sentinel ([`ShardPool`], whose connections leave the pool on a connection error or
//! `READONLY`, so that after a failover new ones go to the new master) and of a cluster.
//! Every pool gets the client certificate, CA and hostname policy of [`RedisTls`].

use deadpool::managed;
use deadpool_redis::redis::{self, aio::ConnectionLike, RedisError, Value};
use deadpool_redis::Runtime;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// What TLS to Redis presents and trusts beyond the `rediss://` scheme
/// (`REDIS_TLS_CLIENT_CERT`/`_KEY`, `REDIS_TLS_CACERT`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`,
/// shared by the per-second Redis as in the reference). Applies to TLS URLs only.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// The client certificate (mTLS) and the CA bundle replacing the system's roots, as PEM;
    /// `None`: neither.
    pub certs: Option<redis::TlsCertificates>,
    /// Verify the server's chain but not that it names the host dialled.
    pub skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret; the rest says nothing worth printing.
        let certs = self.certs.as_ref();
        f.debug_struct("RedisTls")
            .field(
                "client_cert",
                &certs.is_some_and(|c| c.client_tls.is_some()),
            )
            .field("ca", &certs.is_some_and(|c| c.root_cert.is_some()))
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

/// Redis connection settings shared by every shard.
#[derive(Clone, Default)]
pub struct RedisOptions {
    /// `password` or `user:password` (`REDIS_AUTH`), used when a URL carries none.
    pub auth: Option<String>,
    /// Prefix of every key (`CACHE_KEY_PREFIX`).
    pub prefix: String,
    /// Connections per shard.
    pub pool_size: usize,
    /// Client certificate, CA and hostname policy of TLS connections.
    pub tls: RedisTls,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Turns a `REDIS_URL` entry into a URL: `host:port` (the reference's form) gets `redis://`,
/// or `rediss://` with `tls` (`REDIS_TLS`); `auth` is added when the URL has no credentials
/// of its own. TLS verifies the server against the system's roots (`SSL_CERT_FILE` names
/// another bundle).
///
/// # Errors
/// A scheme other than `redis://` or `rediss://`.
pub fn normalize_url(raw: &str, auth: Option<&str>, tls: bool) -> Result<String, String> {
    let raw = raw.trim();
    let (scheme, rest) = if let Some(r) = raw.strip_prefix("redis://") {
        (if tls { "rediss" } else { "redis" }, r)
    } else if let Some(r) = raw.strip_prefix("rediss://") {
        ("rediss", r)
    } else if raw.contains("://") {
        return Err(format!(
            "'{}': not a redis:// or rediss:// URL",
            redact(raw)
        ));
    } else {
        (if tls { "rediss" } else { "redis" }, raw)
    };
    match auth {
        Some(a) if !rest.contains('@') && !a.is_empty() => {
            let (user, pass) = a.split_once(':').unwrap_or(("", a));
            Ok(format!(
                "{scheme}://{}:{}@{rest}",
                encode(user),
                encode(pass)
            ))
        }
        _ => Ok(format!("{scheme}://{rest}")),
    }
}

/// Installs the TLS crypto provider once per process (rustls needs one chosen explicitly).
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Percent-encodes everything but unreserved characters, for credentials in a URL.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A URL without its credentials, for logs and readiness.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &url[..s + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// The master a Sentinel deployment names (`REDIS_TYPE=SENTINEL`): the sentinels are the
/// URLs (with `REDIS_SENTINEL_AUTH` folded in), the master's credentials are
/// [`RedisOptions::auth`] (`REDIS_AUTH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelMaster {
    /// The master's name in the sentinels' configuration (`REDIS_URL`'s first entry).
    pub name: String,
    /// TLS to the master too (`REDIS_TLS`: the reference dials sentinels and master alike).
    pub tls: bool,
}

/// A standalone shard's pool: one server, or the master a set of sentinels names.
pub(crate) enum ShardPool {
    /// A server at a fixed address.
    Single(deadpool_redis::Pool),
    /// The current master of a Sentinel deployment: each new connection asks the sentinels
    /// where the master is (and checks its role), so once a broken connection is dropped
    /// ([`PooledConn`]) the next one goes to the master the sentinels promoted.
    Sentinel(managed::Pool<SentinelManager>),
}

/// A connection of a [`ShardPool`]. A call that fails on the connection itself (I/O, refused,
/// dropped) or is answered `READONLY` (the server was demoted to a replica) marks it stale,
/// and a stale connection is taken out of the pool when dropped instead of going back:
/// deadpool's recycle check is a `PING`, which a demoted master still answers.
pub(crate) struct PooledConn {
    inner: Option<Inner>,
    stale: bool,
}

enum Inner {
    Single(deadpool_redis::Connection),
    Sentinel(managed::Object<SentinelManager>),
}

impl ShardPool {
    /// A connection, made if the pool has none idle.
    ///
    /// # Errors
    /// When no connection can be made (for Sentinel: no sentinel answers, or none names a
    /// master that answers as one).
    pub(crate) async fn get(&self) -> Result<PooledConn, String> {
        let inner = match self {
            ShardPool::Single(p) => Inner::Single(p.get().await.map_err(|e| e.to_string())?),
            ShardPool::Sentinel(p) => Inner::Sentinel(p.get().await.map_err(|e| e.to_string())?),
        };
        Ok(PooledConn {
            inner: Some(inner),
            stale: false,
        })
    }
}

impl PooledConn {
    fn conn(&mut self) -> &mut redis::aio::MultiplexedConnection {
        match self.inner.as_mut().expect("present until dropped") {
            Inner::Single(c) => c,
            Inner::Sentinel(c) => c,
        }
    }

    /// Marks the connection stale when `e` says it, or its server, is no use any more.
    fn check_error(&mut self, e: &RedisError) {
        if is_stale(e) {
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
                Ok(vs) if vs.iter().any(is_readonly_reply) => self.stale = true,
                Ok(_) => {}
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        match self.inner.as_ref().expect("present until dropped") {
            Inner::Single(c) => c.get_db(),
            Inner::Sentinel(c) => c.get_db(),
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
            None => {}
        }
    }
}

/// `url` (normalized) as the redis crate dials it, with `tls`'s certificates and hostname
/// policy when the URL is TLS.
fn connection_info(url: &str, tls: &RedisTls) -> redis::RedisResult<ConnectionInfo> {
    let mut info = url.into_connection_info()?;
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Ok(info);
    }
    if let Some(certs) = &tls.certs {
        // The crate parses the PEM into the address's TLS parameters only through a client.
        info = redis::Client::build_with_tls(info, certs.clone())?
            .get_connection_info()
            .clone();
    }
    if tls.skip_hostname_verification {
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        info = info.set_addr(addr);
    }
    Ok(info)
}

/// A connection pool to the standalone Redis at `url` (normalized), `pool_size` connections;
/// connections are made lazily.
///
/// # Errors
/// When the URL is unusable.
pub(crate) fn pool(url: &str, opts: &RedisOptions) -> Result<ShardPool, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", redact(url));
    let info = connection_info(url, &opts.tls).map_err(|e| fail(&e))?;
    let manager = deadpool_redis::Manager::new(info).map_err(|e| fail(&e))?;
    deadpool_redis::Pool::builder(manager)
        .config(deadpool_redis::PoolConfig::new(opts.pool_size.max(1)))
        .runtime(Runtime::Tokio1)
        .build()
        .map(ShardPool::Single)
        .map_err(|e| fail(&e))
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
        self.client.lock().await.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        ping(conn, &self.pings).await
    }
}

/// The Sentinel client of `sentinel_pool`: the sentinels dialled as their URLs say (their
/// credentials and, over TLS, `opts.tls`), the master with `opts.auth` and, when
/// `master.tls`, `opts.tls`'s certificates.
fn sentinel_client(
    sentinels: &[String],
    master: &SentinelMaster,
    opts: &RedisOptions,
) -> redis::RedisResult<redis::sentinel::SentinelClient> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let infos = sentinels
        .iter()
        .map(|u| connection_info(u, &opts.tls))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    // The builder takes the sentinels' credentials once for all: REDIS_SENTINEL_AUTH is one.
    let creds = infos
        .iter()
        .map(ConnectionInfo::redis_settings)
        .find(|r| r.password().is_some());
    let mut b = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        &master.name,
        SentinelServerType::Master,
    )?;
    if let Some(r) = creds {
        if let Some(user) = r.username() {
            b = b.set_client_to_sentinel_username(user);
        }
        if let Some(pass) = r.password() {
            b = b.set_client_to_sentinel_password(pass);
        }
    }
    if let Some(a) = opts.auth.as_deref().filter(|a| !a.is_empty()) {
        let (user, pass) = a.split_once(':').unwrap_or(("", a));
        if !user.is_empty() {
            b = b.set_client_to_redis_username(user);
        }
        b = b.set_client_to_redis_password(pass);
    }
    if master.tls {
        b = b.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certs) = &opts.tls.certs {
            b = b.set_client_to_redis_certificates(certs.clone());
        }
    }
    b.build()
}

/// A connection pool to the master `master` names, found through the sentinels at
/// `sentinels` (normalized URLs, with the sentinels' credentials); the master's credentials
/// are `opts.auth`. Nothing is dialled until the first connection is wanted.
///
/// # Errors
/// When the URLs are unusable.
pub(crate) fn sentinel_pool(
    sentinels: &[String],
    master: &SentinelMaster,
    opts: &RedisOptions,
) -> Result<ShardPool, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", sentinel_name(sentinels, master));
    let client = sentinel_client(sentinels, master, opts).map_err(|e| fail(&e))?;
    let manager = SentinelManager {
        client: tokio::sync::Mutex::new(client),
        pings: std::sync::atomic::AtomicUsize::new(0),
    };
    managed::Pool::builder(manager)
        .config(managed::PoolConfig::new(opts.pool_size.max(1)))
        .runtime(Runtime::Tokio1)
        .build()
        .map(ShardPool::Sentinel)
        .map_err(|e| fail(&e))
}

/// A Sentinel shard's name, for logs, metrics and routing: the master's name and the
/// sentinels, without credentials.
pub fn sentinel_name(sentinels: &[String], master: &SentinelMaster) -> String {
    let list: Vec<String> = sentinels.iter().map(|u| redact(u)).collect();
    format!("sentinel({}@{})", master.name, list.join(","))
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

/// A pool of connections to a Redis Cluster.
pub(crate) type ClusterPool = managed::Pool<ClusterManager>;

/// The cluster client of `cluster_pool`: the seeds' credentials, and over TLS `opts.tls`
/// (the crate applies one TLS configuration to every node it discovers).
fn cluster_client(
    seeds: &[String],
    opts: &RedisOptions,
) -> redis::RedisResult<redis::cluster::ClusterClient> {
    let infos = seeds
        .iter()
        .map(|u| u.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let tls = infos
        .first()
        .is_some_and(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
    let mut b = redis::cluster::ClusterClientBuilder::new(infos);
    if tls {
        if let Some(certs) = &opts.tls.certs {
            b = b.certs(certs.clone());
        }
        if opts.tls.skip_hostname_verification {
            b = b.danger_accept_invalid_hostnames(true);
        }
    }
    b.build()
}

/// A connection pool to the Redis Cluster reached through `seeds` (normalized URLs).
///
/// # Errors
/// When the URLs are unusable.
pub(crate) fn cluster_pool(seeds: &[String], opts: &RedisOptions) -> Result<ClusterPool, String> {
    let client = cluster_client(seeds, opts).map_err(|e| format!("cluster: {e}"))?;
    let manager = ClusterManager {
        client,
        pings: std::sync::atomic::AtomicUsize::new(0),
    };
    managed::Pool::builder(manager)
        .config(managed::PoolConfig::new(opts.pool_size.max(1)))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| format!("cluster: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_the_reference_form_and_auth() {
        assert_eq!(
            normalize_url("localhost:6379", None, false).unwrap(),
            "redis://localhost:6379"
        );
        assert_eq!(
            normalize_url("redis://h:1/0", Some("s3cr@t"), false).unwrap(),
            "redis://:s3cr%40t@h:1/0"
        );
        assert_eq!(
            normalize_url("h:1", Some("u:p"), false).unwrap(),
            "redis://u:p@h:1"
        );
        assert_eq!(
            normalize_url("redis://a:b@h:1", Some("x"), false).unwrap(),
            "redis://a:b@h:1"
        );
        assert_eq!(normalize_url("h:1", None, true).unwrap(), "rediss://h:1");
        assert_eq!(
            normalize_url("rediss://h:1", None, false).unwrap(),
            "rediss://h:1"
        );
        assert!(normalize_url("http://h:1", None, false).is_err());
    }

    #[test]
    fn names_never_carry_credentials() {
        assert_eq!(redact("redis://user:pw@host:6379/0"), "redis://host:6379/0");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }

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
