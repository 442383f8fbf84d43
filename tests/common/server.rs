//! A sluice server running in this test process, on loopback ports with a manual clock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::clock::ManualClock;
use sluice::settings::Settings;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::{http_async, wait_until_async, T0};

/// A server running in this process.
pub struct Server {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub clock: ManualClock,
    #[allow(dead_code)] // in_process tests write rules into it; redis only keeps it alive
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), sluice::RunError>>>,
}

impl Server {
    /// Starts a server on 127.0.0.1 with `rules` as its only rules file; `tweak` adjusts settings.
    pub async fn start(rules: &str, tweak: impl FnOnce(&mut Settings)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        Self::start_in(dir, tweak).await
    }

    /// Starts a server on the rules directory `dir`.
    pub async fn start_in(dir: tempfile::TempDir, tweak: impl FnOnce(&mut Settings)) -> Server {
        let server = Self::start_unready(dir, tweak).await;
        server.wait_ready().await;
        server
    }

    /// Starts a server on the rules directory `dir` without waiting for it to become ready
    /// (xDS: it is not ready until a rule set arrives).
    pub async fn start_unready(
        dir: tempfile::TempDir,
        tweak: impl FnOnce(&mut Settings),
    ) -> Server {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut settings = Settings::for_addrs(dir.path().to_path_buf(), loopback, loopback);
        settings.reload_debounce = Duration::from_millis(50);
        tweak(&mut settings);
        let listeners = sluice::Listeners::bind(&settings).await.unwrap();
        let (grpc, http) = (
            listeners.grpc.local_addr().unwrap(),
            listeners.http.local_addr().unwrap(),
        );
        let clock = ManualClock::new(T0);
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(sluice::run(
            settings,
            listeners,
            Arc::new(clock.clone()),
            async {
                let _ = rx.await;
            },
        ));
        Server {
            grpc,
            http,
            clock,
            dir,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let what = format!("the server on {} to become ready", self.http);
        wait_until_async(30, &what, || async {
            matches!(
                http_async(self.http, "GET", "/readyz", "").await,
                Ok((200, _, _))
            )
        })
        .await;
    }

    /// A gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// Sends `req` from `clients` concurrent gRPC clients, `each` times per client, and
    /// returns how many answers were OK overall.
    pub async fn admitted_by_concurrent_clients(
        &self,
        req: RateLimitRequest,
        clients: usize,
        each: usize,
    ) -> usize {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (mut c, req) = (self.client().await, req.clone());
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..each {
                    let r = c.should_rate_limit(req.clone()).await.unwrap();
                    ok += usize::from(r.get_ref().overall_code == 1);
                }
                ok
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        admitted
    }

    /// Stops the server and waits for `run` to return.
    pub async fn stop(mut self) -> Result<(), sluice::RunError> {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap()
    }
}
