//! `valve --healthcheck [URL]`: one GET, for container HEALTHCHECKs that have
//! no curl. Plain HTTP only (valve itself serves plain HTTP).

use std::time::Duration;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;

/// How long the whole check may take.
const LIMIT: Duration = Duration::from_secs(5);

/// Asks `url` once; `Ok` with the status on any 2xx answer, else what went wrong.
pub async fn check(url: &str) -> Result<u16, String> {
    match tokio::time::timeout(LIMIT, ask(url)).await {
        Ok(result) => result,
        Err(_) => Err(format!("{url} did not answer within {}s", LIMIT.as_secs())),
    }
}

async fn ask(url: &str) -> Result<u16, String> {
    let uri: http::Uri =
        url.parse().map_err(|e| format!("{url:?} is not a URL ({e}); try http://127.0.0.1:3000/__valve__/healthz"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url:?}: only http:// URLs can be checked"));
    }
    let host = uri.host().ok_or_else(|| format!("{url:?} names no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let addr = format!("{}:{port}", host);
    let stream = tokio::net::TcpStream::connect(&addr).await.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let req = http::Request::get(path)
        .header(http::header::HOST, uri.authority().map(|a| a.as_str()).unwrap_or(host))
        .header(http::header::USER_AGENT, "valve-healthcheck")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    if status.is_success() {
        Ok(status.as_u16())
    } else {
        Err(format!("{url} answered {status}"))
    }
}
