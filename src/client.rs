//! valve's own HTTP/1.1 client connections to the services beside it (the
//! forward-auth service, the trace collector): connect, no Nagle, the
//! handshake, and a task that drives the connection until it closes.

use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A new connection to `host:port`, ready for requests with bodies of type
/// `B`. `service` names the peer in the log line when the connection ends
/// with an error. The error says what failed, for the caller's message.
pub async fn connect<B>(host: &str, port: u16, service: &'static str) -> Result<SendRequest<B>, String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect((host, port)).await.map_err(|e| format!("cannot connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(service, error = %e, "client connection closed");
        }
    });
    Ok(sender)
}
