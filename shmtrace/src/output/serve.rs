//! The metrics endpoint's HTTP side, on hyper: the request is read first
//! (headers within a timeout), at most [`MAX_CONNECTIONS`] at once, each
//! connection bounded in time whatever the client does (a slow reader
//! cannot hold it), accept errors such as EMFILE backed off, and the
//! metrics rendered only for `/metrics`, by the event loop that owns the
//! state, on request.

use std::{convert::Infallible, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, mpsc, oneshot},
};

pub const MAX_CONNECTIONS: usize = 16;
/// To send the request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// For a whole connection, response written included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(20);
use super::metrics::Format;

/// A scrape waiting for the event loop to render the metrics.
pub struct Render {
    /// What the scraper's Accept header asked for.
    pub format: Format,
    pub reply: oneshot::Sender<String>,
}

/// Binds `addr` and serves it in the background; scrapes arrive on the
/// returned channel, each to be answered with the rendered metrics.
pub async fn start(addr: &std::net::SocketAddr) -> Result<mpsc::Receiver<Render>> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let (tx, rx) = mpsc::channel(MAX_CONNECTIONS);
    tokio::spawn(serve(listener, tx));
    Ok(rx)
}

async fn serve(listener: TcpListener, renders: mpsc::Sender<Render>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::from_millis(5);
    loop {
        // Over the cap, connections wait in the kernel's backlog.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                backoff = Duration::from_millis(5);
                s
            }
            Err(_) => {
                // EMFILE, ENFILE, ENOBUFS...: retrying at once would spin.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let renders = renders.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req| answer(req, renders.clone()));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
}

fn reply(status: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = ctype.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn answer(
    req: Request<Incoming>,
    renders: mpsc::Sender<Render>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n",
        ));
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let format = Format::from_accept(
                req.headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok()),
            );
            let (tx, rx) = oneshot::channel();
            match renders.send(Render { format, reply: tx }).await {
                Ok(()) => match rx.await {
                    Ok(body) => reply(StatusCode::OK, format.content_type(), body),
                    Err(_) => reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "shutting down\n",
                    ),
                },
                Err(_) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "shutting down\n",
                ),
            }
        }
        "/healthz" | "/readyz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n"),
    })
}
