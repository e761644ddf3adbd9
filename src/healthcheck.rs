//! `valve --healthcheck [URL]`: one GET, for container HEALTHCHECKs that have
//! no curl. http:// or https:// (valve's own TLS port: a plain request that
//! the port answers "speaks HTTPS" is asked again over TLS). Over TLS the
//! certificate is not checked: this asks whether valve answers on a port of
//! its own machine, not who it is.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

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
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("{url:?}: only http:// and https:// URLs can be checked")),
    };
    match once(&uri, url, tls).await {
        Err(Plain) if !tls => once(&uri, url, true).await.unwrap_or_else(|Plain| Err(format!("{url} answered 400"))),
        Err(Plain) => Err(format!("{url} answered 400")),
        Ok(answer) => answer,
    }
}

/// A plain request the TLS port refused.
struct Plain;

async fn once(uri: &http::Uri, url: &str, tls: bool) -> Result<Result<u16, String>, Plain> {
    let Some(host) = uri.host() else { return Ok(Err(format!("{url:?} names no host"))) };
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addr = format!("{host}:{port}");
    let stream = match tokio::net::TcpStream::connect(&addr).await {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("cannot connect to {addr}: {e}"))),
    };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let req = http::Request::get(path)
        .header(http::header::HOST, uri.authority().map(|a| a.as_str()).unwrap_or(host))
        .header(http::header::USER_AGENT, "valve-healthcheck")
        .body(Empty::<bytes::Bytes>::new());
    let Ok(req) = req else { return Ok(Err(format!("{url:?} is not a URL valve can ask"))) };
    let status = if tls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|_| Plain)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
            .unwrap_or(ServerName::try_from("localhost").expect("a name"));
        let stream = match tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream).await {
            Ok(s) => s,
            Err(e) => return Ok(Err(format!("{url}: TLS: {e}"))),
        };
        send(TokioIo::new(stream), req, url).await
    } else {
        send(TokioIo::new(stream), req, url).await
    };
    match status {
        Ok(s) if s.is_success() => Ok(Ok(s.as_u16())),
        Ok(s) if s == http::StatusCode::BAD_REQUEST && !tls => Err(Plain),
        Ok(s) => Ok(Err(format!("{url} answered {s}"))),
        Err(e) => Ok(Err(e)),
    }
}

async fn send<I>(io: I, req: http::Request<Empty<bytes::Bytes>>, url: &str) -> Result<http::StatusCode, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| format!("{url}: {e}"))?;
    Ok(resp.status())
}

/// Takes any certificate, checking only that the handshake's signatures are sound.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
