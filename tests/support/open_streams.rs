//! A Kubernetes client that counts its own open long-running requests: watches (`watch=true`) and
//! followed logs (`follow=true`), from the moment a request goes out until its response body is
//! dropped. What the API server sees of one process, without the metrics of every other client
//! of the test control plane.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use kube::client::{Body, ClientBuilder, DynBody};
use kube::{Client, Config};
use tower::{BoxError, Layer, Service};

/// Open long-running requests by kind and path (`WATCH /api/v1/namespaces/n/pods`,
/// `LOG /api/v1/namespaces/n/pods/p/log`).
#[derive(Clone, Default)]
pub struct OpenStreams(Arc<Mutex<BTreeMap<String, usize>>>);

impl OpenStreams {
    /// Open watches now.
    pub fn watches(&self) -> usize {
        self.count("WATCH ")
    }

    /// Open followed logs now.
    pub fn logs(&self) -> usize {
        self.count("LOG ")
    }

    /// Everything open now, by kind and path.
    pub fn by_path(&self) -> BTreeMap<String, usize> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, kind: &str) -> usize {
        let open = self.0.lock().unwrap();
        open.iter()
            .filter(|(k, _)| k.starts_with(kind))
            .map(|(_, n)| n)
            .sum()
    }

    fn enter(&self, key: String) -> Open {
        *self.0.lock().unwrap().entry(key.clone()).or_default() += 1;
        Open {
            streams: self.clone(),
            key,
        }
    }
}

/// One open request; counted until dropped (with its response body).
struct Open {
    streams: OpenStreams,
    key: String,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut open = self.streams.0.lock().unwrap();
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// A client for the test control plane (`KUBECONFIG`) and the count of its open streams.
pub async fn counted_client() -> (Client, OpenStreams) {
    let config = Config::infer().await.expect("a kubeconfig (KUBECONFIG)");
    let streams = OpenStreams::default();
    let client = ClientBuilder::try_from(config)
        .expect("a client from the kubeconfig")
        .with_layer(&CountLayer(streams.clone()))
        .build();
    (client, streams)
}

/// The kind and path a long-running request is counted under; `None` for the others.
fn stream_key(uri: &http::Uri) -> Option<String> {
    let query = uri.query().unwrap_or("");
    let has = |param: &str| query.split('&').any(|p| p == param);
    if has("watch=true") || has("watch=1") {
        Some(format!("WATCH {}", uri.path()))
    } else if uri.path().ends_with("/log") && has("follow=true") {
        Some(format!("LOG {}", uri.path()))
    } else {
        None
    }
}

struct CountLayer(OpenStreams);

impl<S> Layer<S> for CountLayer {
    type Service = Count<S>;

    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            streams: self.0.clone(),
        }
    }
}

struct Count<S> {
    inner: S,
    streams: OpenStreams,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Counted>, BoxError>> + Send>>;

impl<S> Service<Request<Body>> for Count<S>
where
    S: Service<Request<Body>, Response = Response<Box<DynBody>>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Counted>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> ResponseFuture {
        let open = stream_key(request.uri()).map(|key| self.streams.enter(key));
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Counted { body, _open: open }))
        })
    }
}

/// A response body that keeps its request counted while it lives.
struct Counted {
    body: Box<DynBody>,
    _open: Option<Open>,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
