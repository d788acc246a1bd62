//! The byte streams a connection is served over: plain TCP, or TLS on top of it.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// A stream split into a read half for the connection task and a write half for its writer task.
pub trait ClientStream: Send + 'static {
    /// What the connection task reads frames from.
    type Reader: AsyncRead + Unpin + Send + 'static;
    /// What the writer task writes frames to.
    type Writer: AsyncWrite + Unpin + Send + 'static;

    /// Splits the stream.
    fn into_halves(self) -> (Self::Reader, Self::Writer);
}

impl ClientStream for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;

    /// TCP halves are independent, so reading and writing never wait on each other.
    fn into_halves(self) -> (Self::Reader, Self::Writer) {
        self.into_split()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> ClientStream for TlsStream<S> {
    type Reader = TlsReader<S>;
    type Writer = tokio::io::WriteHalf<TlsStream<S>>;

    /// One TLS session encrypts and decrypts both directions, so its halves share it behind a lock.
    fn into_halves(self) -> (Self::Reader, Self::Writer) {
        let (reader, writer) = tokio::io::split(self);
        (TlsReader(reader), writer)
    }
}

/// The read half of a TLS stream, where a client that closes its socket without TLS close_notify
/// (pika, for one, after connection.close-ok) ends the stream as a plain TCP close does. AMQP frames
/// carry their own lengths, so a cut-off frame is still noticed.
pub struct TlsReader<S>(ReadHalf<TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsReader<S> {
    fn poll_read(mut self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_read(context, buffer) {
            Poll::Ready(Err(error)) if error.kind() == std::io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
            other => other,
        }
    }
}
