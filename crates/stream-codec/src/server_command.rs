//! What the server sends: a client decodes these, the server encodes them, byte for byte as
//! RabbitMQ 3.10.8's `rabbit_stream_core:frame/1` writes them (quirks included, each noted).

use crate::frame::{begin_frame, end_frame, SIZE_FIELD_BYTES};
use crate::wire::{put_byte_string, put_text, put_text_list, put_text_map, Reader, Text, TextMap};
use crate::{key, DecodeError, ResponseCode, RESPONSE_BIT, VERSION_1};
use bytes::{BufMut, Bytes, BytesMut};

/// A broker in a metadata answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// The index streams refer to it by.
    pub reference: u16,
    /// Host clients connect to.
    pub host: Text,
    /// Stream port clients connect to.
    pub port: u32,
}

/// A stream in a metadata answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMetadata {
    /// The stream asked about.
    pub stream: Text,
    /// OK, or why there is no leader (stream does not exist, not available).
    pub code: ResponseCode,
    /// The leader's broker reference (0xffff when none).
    pub leader: u16,
    /// The replicas' broker references.
    pub replicas: Vec<u16>,
}

/// One refused publishing id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishingError {
    /// The id refused.
    pub publishing_id: u64,
    /// Why.
    pub code: ResponseCode,
}

/// The commands whose answer is a response code alone.
pub const PLAIN_RESPONSE_KEYS: [u16; 6] =
    [key::DECLARE_PUBLISHER, key::DELETE_PUBLISHER, key::SUBSCRIBE, key::UNSUBSCRIBE, key::CREATE, key::DELETE];

/// A command the server sends, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCommand {
    /// The answer of one of [`PLAIN_RESPONSE_KEYS`] (`key` without the response bit).
    Response { key: u16, correlation_id: u32, code: ResponseCode },
    /// 0x0003
    PublishConfirm { publisher_id: u8, publishing_ids: Vec<u64> },
    /// 0x0004
    PublishError { publisher_id: u8, errors: Vec<PublishingError> },
    /// 0x8005
    QueryPublisherSequenceResponse { correlation_id: u32, code: ResponseCode, sequence: u64 },
    /// 0x0008: one osiris chunk, header and all.
    Deliver { subscription_id: u8, chunk: Bytes },
    /// 0x8009: only sent when the credit named an unknown subscription; no correlation id.
    CreditResponse { code: ResponseCode, subscription_id: u8 },
    /// 0x800b
    QueryOffsetResponse { correlation_id: u32, code: ResponseCode, offset: u64 },
    /// 0x800f
    MetadataResponse { correlation_id: u32, brokers: Vec<Broker>, streams: Vec<StreamMetadata> },
    /// 0x0010: a stream the client uses went away.
    MetadataUpdate { code: ResponseCode, stream: Text },
    /// 0x8011
    PeerPropertiesResponse { correlation_id: u32, code: ResponseCode, properties: TextMap },
    /// 0x8012
    SaslHandshakeResponse { correlation_id: u32, code: ResponseCode, mechanisms: Vec<Text> },
    /// 0x8013: a challenge only with SASL_CHALLENGE.
    SaslAuthenticateResponse { correlation_id: u32, code: ResponseCode, challenge: Bytes },
    /// 0x0014: the server's proposal, sent as a request.
    Tune { frame_max: u32, heartbeat_s: u32 },
    /// 0x8015: connection properties (advertised host and port) on success.
    OpenResponse { correlation_id: u32, code: ResponseCode, properties: TextMap },
    /// 0x0016: the server closes (unknown frame, frame too large).
    Close { correlation_id: u32, code: ResponseCode, reason: Text },
    /// 0x8016: the server's answer to the client's close.
    CloseResponse { correlation_id: u32, code: ResponseCode },
    /// 0x0017
    Heartbeat,
    /// 0x0018 (sic: RabbitMQ writes route and partitions answers without the response bit).
    RouteResponse { correlation_id: u32, code: ResponseCode, streams: Vec<Text> },
    /// 0x0019 (sic).
    PartitionsResponse { correlation_id: u32, code: ResponseCode, streams: Vec<Text> },
}

const fn response(key: u16) -> u16 {
    key | RESPONSE_BIT
}

impl ServerCommand {
    /// Decodes one frame (as [`crate::split_frame`] returns it).
    pub fn decode(frame: Bytes) -> Result<ServerCommand, DecodeError> {
        let mut reader = Reader::new(frame);
        let (key, version) = (reader.u16()?, reader.u16()?);
        if version != VERSION_1 {
            return Err(DecodeError::UnknownCommand { key, version });
        }
        let command = decode_fields(key, &mut reader)?;
        reader.finish()?;
        Ok(command)
    }

    /// Appends the frame, size field included.
    pub fn encode(&self, writer: &mut BytesMut) {
        let size_at = begin_frame(writer, self.key(), VERSION_1);
        self.encode_fields(writer);
        end_frame(writer, size_at);
    }

    /// The key the frame is sent with.
    pub fn key(&self) -> u16 {
        use ServerCommand::*;
        match self {
            Response { key, .. } => response(*key),
            PublishConfirm { .. } => key::PUBLISH_CONFIRM,
            PublishError { .. } => key::PUBLISH_ERROR,
            QueryPublisherSequenceResponse { .. } => response(key::QUERY_PUBLISHER_SEQUENCE),
            Deliver { .. } => key::DELIVER,
            CreditResponse { .. } => response(key::CREDIT),
            QueryOffsetResponse { .. } => response(key::QUERY_OFFSET),
            MetadataResponse { .. } => response(key::METADATA),
            MetadataUpdate { .. } => key::METADATA_UPDATE,
            PeerPropertiesResponse { .. } => response(key::PEER_PROPERTIES),
            SaslHandshakeResponse { .. } => response(key::SASL_HANDSHAKE),
            SaslAuthenticateResponse { .. } => response(key::SASL_AUTHENTICATE),
            Tune { .. } => key::TUNE,
            OpenResponse { .. } => response(key::OPEN),
            Close { .. } => key::CLOSE,
            CloseResponse { .. } => response(key::CLOSE),
            Heartbeat => key::HEARTBEAT,
            RouteResponse { .. } => key::ROUTE,
            PartitionsResponse { .. } => key::PARTITIONS,
        }
    }

    fn encode_fields(&self, writer: &mut BytesMut) {
        use ServerCommand::*;
        match self {
            Response { correlation_id, code, .. } | CloseResponse { correlation_id, code } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
            }
            PublishError { publisher_id, errors } => {
                writer.put_u8(*publisher_id);
                writer.put_u32(errors.len() as u32);
                for error in errors {
                    writer.put_u64(error.publishing_id);
                    writer.put_u16(error.code.as_u16());
                }
            }
            QueryPublisherSequenceResponse { correlation_id, code, sequence: value }
            | QueryOffsetResponse { correlation_id, code, offset: value } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                writer.put_u64(*value);
            }
            CreditResponse { code, subscription_id } => {
                writer.put_u16(code.as_u16());
                writer.put_u8(*subscription_id);
            }
            MetadataResponse { correlation_id, brokers, streams } => encode_metadata(writer, *correlation_id, brokers, streams),
            MetadataUpdate { code, stream } => {
                writer.put_u16(code.as_u16());
                put_text(writer, stream);
            }
            PeerPropertiesResponse { correlation_id, code, properties } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                put_text_map(writer, properties);
            }
            SaslHandshakeResponse { correlation_id, code, mechanisms: list }
            | RouteResponse { correlation_id, code, streams: list }
            | PartitionsResponse { correlation_id, code, streams: list } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                put_text_list(writer, list);
            }
            SaslAuthenticateResponse { correlation_id, code, challenge } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                // Nothing follows the code unless there is a challenge. RabbitMQ would write a
                // challenge with a 16-bit length, its Java client reads a 32-bit one; PLAIN never
                // challenges, and Lepus follows the protocol document (bytes, 32-bit).
                if !challenge.is_empty() {
                    put_byte_string(writer, challenge);
                }
            }
            Tune { frame_max, heartbeat_s } => {
                writer.put_u32(*frame_max);
                writer.put_u32(*heartbeat_s);
            }
            OpenResponse { correlation_id, code, properties } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                // RabbitMQ leaves the map out, count included, when it is empty (a refusal).
                if !properties.is_empty() {
                    put_text_map(writer, properties);
                }
            }
            Close { correlation_id, code, reason } => {
                writer.put_u32(*correlation_id);
                writer.put_u16(code.as_u16());
                put_text(writer, reason);
            }
            Heartbeat => {}
            PublishConfirm { publisher_id, publishing_ids } => put_publish_confirm_fields(writer, *publisher_id, publishing_ids),
            Deliver { subscription_id, chunk } => {
                writer.put_u8(*subscription_id);
                writer.put_slice(chunk);
            }
        }
    }
}

fn encode_metadata(writer: &mut BytesMut, correlation_id: u32, brokers: &[Broker], streams: &[StreamMetadata]) {
    writer.put_u32(correlation_id);
    writer.put_u32(brokers.len() as u32);
    for broker in brokers {
        writer.put_u16(broker.reference);
        put_text(writer, &broker.host);
        writer.put_u32(broker.port);
    }
    writer.put_u32(streams.len() as u32);
    for stream in streams {
        put_text(writer, &stream.stream);
        writer.put_u16(stream.code.as_u16());
        writer.put_u16(stream.leader);
        writer.put_u32(stream.replicas.len() as u32);
        for replica in &stream.replicas {
            writer.put_u16(*replica);
        }
    }
}

/// Appends a publish confirm for `publishing_ids`, borrowed: the server's hot path.
pub fn encode_publish_confirm(writer: &mut BytesMut, publisher_id: u8, publishing_ids: &[u64]) {
    let size_at = begin_frame(writer, key::PUBLISH_CONFIRM, VERSION_1);
    put_publish_confirm_fields(writer, publisher_id, publishing_ids);
    end_frame(writer, size_at);
}

fn put_publish_confirm_fields(writer: &mut BytesMut, publisher_id: u8, publishing_ids: &[u64]) {
    writer.put_u8(publisher_id);
    writer.put_u32(publishing_ids.len() as u32);
    for publishing_id in publishing_ids {
        writer.put_u64(*publishing_id);
    }
}

/// Bytes of a deliver frame before its chunk: size field, key, version, subscription id.
pub const DELIVER_HEADER_BYTES: usize = SIZE_FIELD_BYTES + 5;

/// Appends the start of a deliver frame whose chunk of `chunk_bytes` follows: the server writes
/// the chunk itself straight from the store, as RabbitMQ sends it with `sendfile`.
pub fn encode_deliver_header(writer: &mut BytesMut, subscription_id: u8, chunk_bytes: usize) {
    writer.put_u32((DELIVER_HEADER_BYTES - SIZE_FIELD_BYTES + chunk_bytes) as u32);
    writer.put_u16(key::DELIVER);
    writer.put_u16(VERSION_1);
    writer.put_u8(subscription_id);
}

fn code(reader: &mut Reader) -> Result<ResponseCode, DecodeError> {
    Ok(ResponseCode::from_u16(reader.u16()?))
}

fn decode_fields(key: u16, reader: &mut Reader) -> Result<ServerCommand, DecodeError> {
    use ServerCommand::*;
    const QUERY_PUBLISHER_SEQUENCE: u16 = response(key::QUERY_PUBLISHER_SEQUENCE);
    const CREDIT: u16 = response(key::CREDIT);
    const QUERY_OFFSET: u16 = response(key::QUERY_OFFSET);
    const METADATA: u16 = response(key::METADATA);
    const PEER_PROPERTIES: u16 = response(key::PEER_PROPERTIES);
    const SASL_HANDSHAKE: u16 = response(key::SASL_HANDSHAKE);
    const SASL_AUTHENTICATE: u16 = response(key::SASL_AUTHENTICATE);
    const OPEN: u16 = response(key::OPEN);
    const CLOSE: u16 = response(key::CLOSE);
    const ROUTE: u16 = response(key::ROUTE);
    const PARTITIONS: u16 = response(key::PARTITIONS);
    Ok(match key {
        plain if plain & RESPONSE_BIT != 0 && PLAIN_RESPONSE_KEYS.contains(&(plain & !RESPONSE_BIT)) => {
            Response { key: plain & !RESPONSE_BIT, correlation_id: reader.u32()?, code: code(reader)? }
        }
        key::PUBLISH_CONFIRM => {
            let publisher_id = reader.u8()?;
            let count = reader.count(8)?;
            PublishConfirm { publisher_id, publishing_ids: (0..count).map(|_| reader.u64()).collect::<Result<_, _>>()? }
        }
        key::PUBLISH_ERROR => {
            let publisher_id = reader.u8()?;
            let count = reader.count(10)?;
            let read_error = |reader: &mut Reader| Ok(PublishingError { publishing_id: reader.u64()?, code: code(reader)? });
            PublishError { publisher_id, errors: (0..count).map(|_| read_error(reader)).collect::<Result<_, _>>()? }
        }
        QUERY_PUBLISHER_SEQUENCE => {
            QueryPublisherSequenceResponse { correlation_id: reader.u32()?, code: code(reader)?, sequence: reader.u64()? }
        }
        key::DELIVER => Deliver { subscription_id: reader.u8()?, chunk: reader.rest() },
        CREDIT => CreditResponse { code: code(reader)?, subscription_id: reader.u8()? },
        QUERY_OFFSET => QueryOffsetResponse { correlation_id: reader.u32()?, code: code(reader)?, offset: reader.u64()? },
        METADATA => decode_metadata(reader)?,
        key::METADATA_UPDATE => MetadataUpdate { code: code(reader)?, stream: reader.text()? },
        PEER_PROPERTIES => PeerPropertiesResponse { correlation_id: reader.u32()?, code: code(reader)?, properties: reader.text_map()? },
        SASL_HANDSHAKE => SaslHandshakeResponse { correlation_id: reader.u32()?, code: code(reader)?, mechanisms: reader.text_list()? },
        SASL_AUTHENTICATE => {
            let (correlation_id, code) = (reader.u32()?, code(reader)?);
            let challenge = if reader.remaining() == 0 { Bytes::new() } else { reader.byte_string()? };
            SaslAuthenticateResponse { correlation_id, code, challenge }
        }
        key::TUNE => Tune { frame_max: reader.u32()?, heartbeat_s: reader.u32()? },
        OPEN => {
            let (correlation_id, code) = (reader.u32()?, code(reader)?);
            let properties = if reader.remaining() == 0 { TextMap::new() } else { reader.text_map()? };
            OpenResponse { correlation_id, code, properties }
        }
        key::CLOSE => Close { correlation_id: reader.u32()?, code: code(reader)?, reason: reader.text()? },
        CLOSE => CloseResponse { correlation_id: reader.u32()?, code: code(reader)? },
        key::HEARTBEAT => Heartbeat,
        key::ROUTE | ROUTE => RouteResponse { correlation_id: reader.u32()?, code: code(reader)?, streams: reader.text_list()? },
        key::PARTITIONS | PARTITIONS => {
            PartitionsResponse { correlation_id: reader.u32()?, code: code(reader)?, streams: reader.text_list()? }
        }
        other => return Err(DecodeError::UnknownCommand { key: other, version: VERSION_1 }),
    })
}

fn decode_metadata(reader: &mut Reader) -> Result<ServerCommand, DecodeError> {
    let correlation_id = reader.u32()?;
    let broker_count = reader.count(8)?;
    let read_broker = |reader: &mut Reader| Ok(Broker { reference: reader.u16()?, host: reader.text()?, port: reader.u32()? });
    let brokers = (0..broker_count).map(|_| read_broker(reader)).collect::<Result<_, DecodeError>>()?;
    let stream_count = reader.count(10)?;
    let read_stream = |reader: &mut Reader| {
        let (stream, code, leader) = (reader.text()?, code(reader)?, reader.u16()?);
        let replica_count = reader.count(2)?;
        let replicas = (0..replica_count).map(|_| reader.u16()).collect::<Result<_, _>>()?;
        Ok(StreamMetadata { stream, code, leader, replicas })
    };
    let streams = (0..stream_count).map(|_| read_stream(reader)).collect::<Result<_, DecodeError>>()?;
    Ok(ServerCommand::MetadataResponse { correlation_id, brokers, streams })
}
