//! A small ADS management server for the xDS tests: it serves the current set of
//! `RateLimitConfig`s (state of the world) on every stream once the client has asked, pushes
//! each new set to the open streams, and records every request and the headers of every
//! stream. `kill` ends the streams and the listener, as a restarting server would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3 as rl;
use parking_lot::Mutex;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// A version and its resources.
type Snapshot = Option<(String, Vec<Any>)>;

#[derive(Default)]
struct Recorded {
    requests: Vec<DiscoveryRequest>,
    headers: Vec<tonic::metadata::MetadataMap>,
    /// (version, nonce) of every response sent.
    sent: Vec<(String, String)>,
}

struct Shared {
    snapshot: watch::Sender<Snapshot>,
    recorded: Mutex<Recorded>,
    nonce: std::sync::atomic::AtomicU64,
    kill: CancellationToken,
}

/// The management server.
pub struct AdsServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    #[allow(dead_code)] // awaited by `kill`, which only the in_process xDS tests call
    task: tokio::task::JoinHandle<()>,
}

impl AdsServer {
    /// Starts a server over TLS (sluice's own listener code: mTLS when `tls` names a CA).
    pub async fn start_tls(tls: sluice::server::tls::GrpcTls, snapshot: Snapshot) -> AdsServer {
        Self::start_with("127.0.0.1:0".parse().unwrap(), snapshot, Some(tls)).await
    }

    async fn start_with(
        addr: SocketAddr,
        snapshot: Snapshot,
        tls: Option<sluice::server::tls::GrpcTls>,
    ) -> AdsServer {
        let listener = bind(addr).await;
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            snapshot: watch::channel(snapshot).0,
            recorded: Mutex::default(),
            nonce: 0.into(),
            kill: CancellationToken::new(),
        });
        let service = AggregatedDiscoveryServiceServer::new(Ads(shared.clone()));
        let kill = shared.kill.clone();
        let router = tonic::transport::Server::builder().add_service(service);
        let task = tokio::spawn(async move {
            let _ = match tls {
                Some(tls) => {
                    let config = sluice::server::tls::server_config(&tls).unwrap();
                    let incoming = sluice::server::grpc_conn::incoming(
                        listener,
                        Default::default(),
                        sluice::server::tls::handshake(config),
                    );
                    router
                        .serve_with_incoming_shutdown(incoming, kill.cancelled_owned())
                        .await
                }
                None => {
                    router
                        .serve_with_incoming_shutdown(
                            TcpListenerStream::new(listener),
                            kill.cancelled_owned(),
                        )
                        .await
                }
            };
        });
        AdsServer { addr, shared, task }
    }

    /// Serves a new set to every open stream (and to later ones).
    pub fn set(&self, version: &str, configs: &[rl::RateLimitConfig]) {
        self.shared.snapshot.send_replace(Some((
            version.to_string(),
            configs.iter().map(any).collect(),
        )));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.shared.recorded.lock().requests.clone()
    }
}

/// What the xDS protocol tests (in_process) add: plain-text servers, a restart on the same
/// port, and a look at the streams' headers and nonces. The drop-in test (redis) serves over
/// TLS and reads the requests only, so these are dead code in that crate.
#[allow(dead_code)]
impl AdsServer {
    /// Starts a server on a free loopback port, serving `snapshot` (nothing when `None`).
    pub async fn start(snapshot: Snapshot) -> AdsServer {
        Self::start_on("127.0.0.1:0".parse().unwrap(), snapshot).await
    }

    /// Starts a server on `addr` (a restart reuses the port the client knows).
    pub async fn start_on(addr: SocketAddr, snapshot: Snapshot) -> AdsServer {
        Self::start_with(addr, snapshot, None).await
    }

    /// The headers of every stream opened so far.
    pub fn headers(&self) -> Vec<tonic::metadata::MetadataMap> {
        self.shared.recorded.lock().headers.clone()
    }

    /// The nonce of the last response that carried `version`.
    pub fn nonce_of(&self, version: &str) -> Option<String> {
        let recorded = self.shared.recorded.lock();
        recorded
            .sent
            .iter()
            .rev()
            .find(|(v, _)| v == version)
            .map(|(_, n)| n.clone())
    }

    /// Polls until a request satisfies `pred` and returns it.
    pub async fn wait_request(
        &self,
        what: &str,
        pred: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let mut found = None;
        super::wait_until_async(30, what, || {
            found = self.requests().into_iter().find(&pred);
            std::future::ready(found.is_some())
        })
        .await;
        found.unwrap()
    }

    /// Ends every stream and closes the listener, as a server going away does.
    pub async fn kill(self) -> SocketAddr {
        self.shared.kill.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        self.addr
    }
}

/// Binds `addr`, retrying briefly: a restart on the same port may race the old socket's close.
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let mut last = None;
    for _ in 0..100 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot bind {addr}: {last:?}");
}

/// A `RateLimitConfig` as a resource.
pub fn any(config: &rl::RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }
}

/// A config of one domain with one limited key per `(key, unit, requests_per_unit)`.
pub fn config(domain: &str, limits: &[(&str, rl::RateLimitUnit, u32)]) -> rl::RateLimitConfig {
    rl::RateLimitConfig {
        name: domain.to_string(),
        domain: domain.to_string(),
        descriptors: limits
            .iter()
            .map(|(key, unit, n)| rl::RateLimitDescriptor {
                key: key.to_string(),
                rate_limit: Some(rl::RateLimitPolicy {
                    unit: *unit as i32,
                    requests_per_unit: *n,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    }
}

struct Ads(Arc<Shared>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let shared = self.0.clone();
        shared
            .recorded
            .lock()
            .headers
            .push(request.metadata().clone());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            let mut snapshot = shared.snapshot.subscribe();
            let mut subscribed = false;
            loop {
                let send_now = tokio::select! {
                    _ = shared.kill.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("the server is going away"))).await;
                        return;
                    }
                    msg = incoming.message() => match msg {
                        Ok(Some(r)) => {
                            shared.recorded.lock().requests.push(r);
                            // The first request subscribes; the others are ACKs and NACKs.
                            !std::mem::replace(&mut subscribed, true)
                        }
                        _ => return,
                    },
                    changed = snapshot.changed(), if subscribed => {
                        if changed.is_err() { return; }
                        true
                    }
                };
                if !send_now {
                    continue;
                }
                let current = snapshot.borrow_and_update().clone();
                if let Some((version, resources)) = current {
                    let nonce = shared
                        .nonce
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                        .to_string();
                    shared
                        .recorded
                        .lock()
                        .sent
                        .push((version.clone(), nonce.clone()));
                    let response = DiscoveryResponse {
                        version_info: version,
                        resources,
                        type_url: TYPE_URL.into(),
                        nonce,
                        ..Default::default()
                    };
                    if tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}
