//! `lepus perf sink`: a stand-in broker that confirms every publish at once and keeps nothing,
//! so that `lepus perf producer` against it measures the load generator's own ceiling (rate and
//! CPU per message) with no broker in the way.

use amqp_codec::{
    decode_frame, encode_method_frame, BasicAck, ChannelOpenOk, ConfirmSelectOk, ConnectionClose, ConnectionCloseOk, ConnectionOpenOk,
    ConnectionStart, ConnectionTune, ExchangeDeclareOk, ExchangeDeleteOk, FieldTable, FieldValue, FramePayload, LongStr, Method,
    QueueDeclareOk, QueueDeleteOk, TxCommitOk, TxSelectOk, PROTOCOL_HEADER,
};
use bytes::{Bytes, BytesMut};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves connections on `127.0.0.1:port` for at most `lifetime`.
pub async fn serve(port: u16, lifetime: Duration) -> std::io::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!("lepus perf sink: listening on 127.0.0.1:{} for {} s", listener.local_addr()?.port(), lifetime.as_secs());
    let accept = async {
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            tokio::spawn(async move {
                if let Err(error) = connection(stream).await {
                    eprintln!("sink connection: {error}");
                }
            });
        }
    };
    match tokio::time::timeout(lifetime, accept).await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}

async fn connection(mut stream: TcpStream) -> std::io::Result<()> {
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await?;
    if &header != PROTOCOL_HEADER {
        return Ok(());
    }
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut properties = FieldTable::new();
    properties.insert("product", FieldValue::LongStr(Bytes::from_static(b"lepus perf sink")));
    properties.insert("version", FieldValue::LongStr(Bytes::from_static(env!("CARGO_PKG_VERSION").as_bytes())));
    let start = ConnectionStart {
        version_major: 0,
        version_minor: 9,
        server_properties: properties,
        mechanisms: LongStr::from("PLAIN"),
        locales: LongStr::from("en_US"),
    };
    encode_method_frame(&mut out, 0, &Method::ConnectionStart(start));
    stream.write_all(&out).await?;
    out.clear();
    let mut input = BytesMut::with_capacity(256 * 1024);
    // Per channel: the next publish sequence number and whether confirms are on.
    let mut published = 0u64;
    let mut acked = 0u64;
    let mut confirms = false;
    loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        loop {
            let frame = match decode_frame(&mut input, 0) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => return Err(std::io::Error::other(error.to_string())),
            };
            let channel = frame.channel;
            let FramePayload::Method(method) = frame.payload else {
                continue;
            };
            let reply = match method {
                Method::ConnectionStartOk(_) => {
                    Some(Method::ConnectionTune(ConnectionTune { channel_max: 2047, frame_max: 131_072, heartbeat: 0 }))
                }
                Method::ConnectionOpen(_) => Some(Method::ConnectionOpenOk(ConnectionOpenOk::default())),
                Method::ChannelOpen(_) => Some(Method::ChannelOpenOk(ChannelOpenOk::default())),
                Method::ConfirmSelect(_) => {
                    confirms = true;
                    Some(Method::ConfirmSelectOk(ConfirmSelectOk::default()))
                }
                Method::TxSelect(_) => Some(Method::TxSelectOk(TxSelectOk::default())),
                Method::TxCommit(_) => Some(Method::TxCommitOk(TxCommitOk::default())),
                Method::QueueDeclare(declare) => {
                    Some(Method::QueueDeclareOk(QueueDeclareOk { queue: declare.queue, message_count: 0, consumer_count: 0 }))
                }
                Method::QueueDelete(_) => Some(Method::QueueDeleteOk(QueueDeleteOk::default())),
                Method::ExchangeDeclare(_) => Some(Method::ExchangeDeclareOk(ExchangeDeclareOk::default())),
                Method::ExchangeDelete(_) => Some(Method::ExchangeDeleteOk(ExchangeDeleteOk::default())),
                Method::BasicPublish(_) => {
                    published += 1;
                    None
                }
                Method::ConnectionClose(ConnectionClose { .. }) => {
                    encode_method_frame(&mut out, 0, &Method::ConnectionCloseOk(ConnectionCloseOk::default()));
                    stream.write_all(&out).await?;
                    return Ok(());
                }
                _ => None,
            };
            if let Some(reply) = reply {
                encode_method_frame(&mut out, channel, &reply);
            }
        }
        // One multiple-ack per read: what a broker with a perfect group commit would do.
        if confirms && published > acked {
            encode_method_frame(&mut out, 1, &Method::BasicAck(BasicAck { delivery_tag: published, multiple: true }));
            acked = published;
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            out.clear();
        }
    }
}
