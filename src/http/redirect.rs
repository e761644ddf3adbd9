//! The plain-HTTP port beside HTTPS (`--http-port`): every request is
//! redirected (308, method and body kept) to the same host and path over
//! HTTPS, except an ACME authority's HTTP-01 check, which is answered here.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use super::conn::{accept_failed, serve, Speaks};
use super::reply::{error, ReplyBody};
use super::server::ClientLimits;
use crate::tls::acme::Challenges;

/// Where ACME's HTTP-01 checks come (RFC 8555 section 8.3).
pub const CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";

/// Connections the plain-HTTP port holds at once: each is one redirect.
const CONNECTIONS: usize = 256;

/// Serves the redirects (to `https_port`) and the checks until valve exits.
pub fn serve_redirects(listener: TcpListener, https_port: u16, challenges: Arc<Challenges>, limits: ClientLimits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e, "http");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
            let challenges = challenges.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let answer = answer(&req, https_port, &challenges);
                async move { Ok::<_, Infallible>(answer) }
            });
            tokio::spawn(async move {
                let never = tokio_util::sync::CancellationToken::new();
                serve(stream, peer, &Speaks::Plain, limits, service, never, false).await;
                drop(slot);
            });
        }
    });
}

fn answer(req: &Request<Incoming>, https_port: u16, challenges: &Challenges) -> Response<ReplyBody> {
    let path = req.uri().path();
    if let Some(token) = path.strip_prefix(CHALLENGE_PATH) {
        return match challenges.answer(token) {
            Some(key_authorization) => {
                let mut resp = Response::new(ReplyBody::text(key_authorization));
                resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                resp
            }
            None => error(StatusCode::NOT_FOUND, "no ACME check is under way for this token"),
        };
    }
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(host_only);
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "this port redirects to HTTPS and needs a Host header to say where");
    };
    let port = if https_port == 443 { String::new() } else { format!(":{https_port}") };
    let target = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let location = format!("https://{host}{port}{target}");
    let mut resp = Response::new(ReplyBody::text(""));
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    match HeaderValue::from_str(&location) {
        Ok(v) => {
            resp.headers_mut().insert(header::LOCATION, v);
            resp
        }
        Err(_) => error(StatusCode::BAD_REQUEST, "the Host header cannot be part of a URL"),
    }
}

/// A Host header without its port (`[::1]:80` keeps its brackets).
fn host_only(host: &str) -> &str {
    if let Some(end) = host.strip_prefix('[').and_then(|rest| rest.find(']')) {
        return &host[..end + 2];
    }
    host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::host_only;

    #[test]
    fn a_host_loses_its_port_only() {
        assert_eq!(host_only("apps.example.org:80"), "apps.example.org");
        assert_eq!(host_only("apps.example.org"), "apps.example.org");
        assert_eq!(host_only("[::1]:8080"), "[::1]");
        assert_eq!(host_only("127.0.0.1"), "127.0.0.1");
    }
}
