//! [`AuthLayer`]: the tower layer every cluster gRPC server runs, which
//! authenticates the caller (its TLS client certificate) and authorizes
//! the call against the server's [`Policy`] before any handler runs.

use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::{Identity, Policy, Transport};

/// Authenticates and authorizes every call (see the crate docs).
#[derive(Clone, Debug)]
pub struct AuthLayer {
    policy: Policy,
    enforce: bool,
}

impl AuthLayer {
    /// Enforces `policy` under TLS; lets every call through when
    /// `transport` is [`Transport::Insecure`].
    pub fn new(policy: Policy, transport: &Transport) -> Self {
        AuthLayer {
            policy,
            enforce: transport.is_tls(),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            policy: self.policy,
            enforce: self.enforce,
        }
    }
}

/// The service [`AuthLayer`] wraps around a server's routes.
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    policy: Policy,
    enforce: bool,
}

/// The caller's identity from the TLS connection info in `extensions`
/// (`Err` with the reason when there is none).
pub fn peer_identity(extensions: &http::Extensions) -> Result<Identity, tonic::Status> {
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.peer_certs())
        .ok_or_else(|| {
            tonic::Status::unauthenticated("a cluster client certificate is required")
        })?;
    let leaf = certs.first().ok_or_else(|| {
        tonic::Status::unauthenticated("a cluster client certificate is required")
    })?;
    Identity::from_der(leaf)
        .map_err(|e| tonic::Status::unauthenticated(format!("client certificate: {e}")))
}

/// Decides one call: the caller's identity when `path` allows its role.
pub fn authorize(
    policy: &Policy,
    path: &str,
    extensions: &http::Extensions,
) -> Result<Identity, tonic::Status> {
    let identity = peer_identity(extensions)?;
    if policy.allows(path, identity.role) {
        Ok(identity)
    } else {
        Err(tonic::Status::permission_denied(format!(
            "{identity} may not call {path}"
        )))
    }
}

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if !self.enforce {
            return Either::Left(self.inner.call(req));
        }
        match authorize(&self.policy, req.uri().path(), req.extensions()) {
            Ok(identity) => {
                req.extensions_mut().insert(identity);
                Either::Left(self.inner.call(req))
            }
            Err(status) => {
                tracing::debug!(path = req.uri().path(), %status, "cluster call refused");
                Either::Right(ready(Ok(status.into_http())))
            }
        }
    }
}

/// The caller's identity a handler sees, inserted by [`AuthLayer`]
/// (`None` in insecure mode).
pub fn caller<T>(request: &tonic::Request<T>) -> Option<&Identity> {
    request.extensions().get::<Identity>()
}
