//! What a client sends: the server decodes these, a client encodes them. Field order and the
//! optional parts follow `rabbit_stream_core.erl` of RabbitMQ 3.10.8, which decides what real
//! clients must send.

use crate::frame::{begin_frame, end_frame};
use crate::publish::PublishedMessages;
use crate::wire::{put_byte_string, put_text, put_text_list, put_text_map, Reader, Text, TextMap};
use crate::{key, offset_type, DecodeError, RESPONSE_BIT, VERSION_1};
use bytes::{BufMut, Bytes, BytesMut};

/// Where a subscription starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpecification {
    /// The first offset still in the stream.
    First,
    /// The start of the last chunk.
    Last,
    /// The next offset written after the subscription.
    Next,
    /// A given offset (clamped to what the stream holds).
    Offset(u64),
    /// The first chunk written at or after this time, milliseconds since the epoch.
    Timestamp(i64),
}

/// A command a client sends, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCommand {
    /// 0x0001: a publisher with an id of the client's choice and an optional reference (empty
    /// when none) for deduplication.
    DeclarePublisher { correlation_id: u32, publisher_id: u8, reference: Text, stream: Text },
    /// 0x0002: messages, confirmed later by publishing id.
    Publish { publisher_id: u8, messages: PublishedMessages },
    /// 0x0005: the last publishing id stored for a reference.
    QueryPublisherSequence { correlation_id: u32, reference: Text, stream: Text },
    /// 0x0006
    DeletePublisher { correlation_id: u32, publisher_id: u8 },
    /// 0x0007: `credit` is the number of chunks the server may send before more credit.
    Subscribe { correlation_id: u32, subscription_id: u8, stream: Text, offset: OffsetSpecification, credit: u16, properties: TextMap },
    /// 0x0009: more chunks for a subscription (answered only when it does not exist).
    Credit { subscription_id: u8, credit: u16 },
    /// 0x000a: stores a consumer's offset under a reference (no answer).
    StoreOffset { reference: Text, stream: Text, offset: u64 },
    /// 0x000b
    QueryOffset { correlation_id: u32, reference: Text, stream: Text },
    /// 0x000c
    Unsubscribe { correlation_id: u32, subscription_id: u8 },
    /// 0x000d: arguments such as `max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`.
    Create { correlation_id: u32, stream: Text, arguments: TextMap },
    /// 0x000e
    Delete { correlation_id: u32, stream: Text },
    /// 0x000f
    Metadata { correlation_id: u32, streams: Vec<Text> },
    /// 0x0011
    PeerProperties { correlation_id: u32, properties: TextMap },
    /// 0x0012
    SaslHandshake { correlation_id: u32 },
    /// 0x0013: the mechanism's response (for PLAIN: `\0user\0password`).
    SaslAuthenticate { correlation_id: u32, mechanism: Text, response: Bytes },
    /// 0x8014, the answer to the server's tune (RabbitMQ also takes it as 0x0014).
    Tune { frame_max: u32, heartbeat_s: u32 },
    /// 0x0015
    Open { correlation_id: u32, virtual_host: Text },
    /// 0x0016: the client closes.
    Close { correlation_id: u32, code: u16, reason: Text },
    /// 0x8016: the client's answer to the server's close.
    CloseResponse { correlation_id: u32, code: u16 },
    /// 0x0017
    Heartbeat,
    /// 0x0018: the streams of a super stream a routing key goes to.
    Route { correlation_id: u32, routing_key: Text, super_stream: Text },
    /// 0x0019: the streams of a super stream.
    Partitions { correlation_id: u32, super_stream: Text },
}

impl ClientCommand {
    /// Decodes one frame (as [`crate::split_frame`] returns it).
    pub fn decode(frame: Bytes) -> Result<ClientCommand, DecodeError> {
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
        use ClientCommand::*;
        match self {
            DeclarePublisher { .. } => key::DECLARE_PUBLISHER,
            Publish { .. } => key::PUBLISH,
            QueryPublisherSequence { .. } => key::QUERY_PUBLISHER_SEQUENCE,
            DeletePublisher { .. } => key::DELETE_PUBLISHER,
            Subscribe { .. } => key::SUBSCRIBE,
            Credit { .. } => key::CREDIT,
            StoreOffset { .. } => key::STORE_OFFSET,
            QueryOffset { .. } => key::QUERY_OFFSET,
            Unsubscribe { .. } => key::UNSUBSCRIBE,
            Create { .. } => key::CREATE,
            Delete { .. } => key::DELETE,
            Metadata { .. } => key::METADATA,
            PeerProperties { .. } => key::PEER_PROPERTIES,
            SaslHandshake { .. } => key::SASL_HANDSHAKE,
            SaslAuthenticate { .. } => key::SASL_AUTHENTICATE,
            Tune { .. } => key::TUNE | RESPONSE_BIT,
            Open { .. } => key::OPEN,
            Close { .. } => key::CLOSE,
            CloseResponse { .. } => key::CLOSE | RESPONSE_BIT,
            Heartbeat => key::HEARTBEAT,
            Route { .. } => key::ROUTE,
            Partitions { .. } => key::PARTITIONS,
        }
    }

    /// The correlation id, for the commands that expect an answer.
    pub fn correlation_id(&self) -> Option<u32> {
        use ClientCommand::*;
        match self {
            DeclarePublisher { correlation_id, .. }
            | QueryPublisherSequence { correlation_id, .. }
            | DeletePublisher { correlation_id, .. }
            | Subscribe { correlation_id, .. }
            | QueryOffset { correlation_id, .. }
            | Unsubscribe { correlation_id, .. }
            | Create { correlation_id, .. }
            | Delete { correlation_id, .. }
            | Metadata { correlation_id, .. }
            | PeerProperties { correlation_id, .. }
            | SaslHandshake { correlation_id }
            | SaslAuthenticate { correlation_id, .. }
            | Open { correlation_id, .. }
            | Close { correlation_id, .. }
            | CloseResponse { correlation_id, .. }
            | Route { correlation_id, .. }
            | Partitions { correlation_id, .. } => Some(*correlation_id),
            Publish { .. } | Credit { .. } | StoreOffset { .. } | Tune { .. } | Heartbeat => None,
        }
    }

    fn encode_fields(&self, writer: &mut BytesMut) {
        use ClientCommand::*;
        if let Some(correlation_id) = self.correlation_id() {
            writer.put_u32(correlation_id);
        }
        match self {
            DeclarePublisher { publisher_id, reference, stream, .. } => {
                writer.put_u8(*publisher_id);
                put_text(writer, reference);
                put_text(writer, stream);
            }
            Publish { publisher_id, messages } => {
                writer.put_u8(*publisher_id);
                messages.write(writer);
            }
            QueryPublisherSequence { reference, stream, .. } | QueryOffset { reference, stream, .. } => {
                put_text(writer, reference);
                put_text(writer, stream);
            }
            DeletePublisher { publisher_id, .. } => writer.put_u8(*publisher_id),
            Subscribe { subscription_id, stream, offset, credit, properties, .. } => {
                writer.put_u8(*subscription_id);
                put_text(writer, stream);
                put_offset(writer, *offset);
                writer.put_u16(*credit);
                // RabbitMQ's own client leaves the map out when it is empty; both forms decode.
                if !properties.is_empty() {
                    put_text_map(writer, properties);
                }
            }
            Credit { subscription_id, credit } => {
                writer.put_u8(*subscription_id);
                writer.put_u16(*credit);
            }
            StoreOffset { reference, stream, offset } => {
                put_text(writer, reference);
                put_text(writer, stream);
                writer.put_u64(*offset);
            }
            Unsubscribe { subscription_id, .. } => writer.put_u8(*subscription_id),
            Create { stream, arguments, .. } => {
                put_text(writer, stream);
                put_text_map(writer, arguments);
            }
            Delete { stream, .. } => put_text(writer, stream),
            Metadata { streams, .. } => put_text_list(writer, streams),
            PeerProperties { properties, .. } => put_text_map(writer, properties),
            SaslHandshake { .. } | Heartbeat => {}
            SaslAuthenticate { mechanism, response, .. } => {
                put_text(writer, mechanism);
                put_byte_string(writer, response);
            }
            Tune { frame_max, heartbeat_s } => {
                writer.put_u32(*frame_max);
                writer.put_u32(*heartbeat_s);
            }
            Open { virtual_host, .. } => put_text(writer, virtual_host),
            Close { code, reason, .. } => {
                writer.put_u16(*code);
                put_text(writer, reason);
            }
            CloseResponse { code, .. } => writer.put_u16(*code),
            Route { routing_key, super_stream, .. } => {
                put_text(writer, routing_key);
                put_text(writer, super_stream);
            }
            Partitions { super_stream, .. } => put_text(writer, super_stream),
        }
    }
}

fn put_offset(writer: &mut BytesMut, offset: OffsetSpecification) {
    match offset {
        OffsetSpecification::First => writer.put_u16(offset_type::FIRST),
        OffsetSpecification::Last => writer.put_u16(offset_type::LAST),
        OffsetSpecification::Next => writer.put_u16(offset_type::NEXT),
        OffsetSpecification::Offset(offset) => {
            writer.put_u16(offset_type::OFFSET);
            writer.put_u64(offset);
        }
        OffsetSpecification::Timestamp(timestamp_ms) => {
            writer.put_u16(offset_type::TIMESTAMP);
            writer.put_i64(timestamp_ms);
        }
    }
}

fn read_offset(reader: &mut Reader) -> Result<OffsetSpecification, DecodeError> {
    Ok(match reader.u16()? {
        offset_type::FIRST => OffsetSpecification::First,
        offset_type::LAST => OffsetSpecification::Last,
        offset_type::NEXT => OffsetSpecification::Next,
        offset_type::OFFSET => OffsetSpecification::Offset(reader.u64()?),
        offset_type::TIMESTAMP => OffsetSpecification::Timestamp(reader.i64()?),
        other => return Err(DecodeError::UnknownOffsetType(other)),
    })
}

const TUNE_RESPONSE: u16 = key::TUNE | RESPONSE_BIT;
const CLOSE_RESPONSE: u16 = key::CLOSE | RESPONSE_BIT;

fn decode_fields(key: u16, reader: &mut Reader) -> Result<ClientCommand, DecodeError> {
    use ClientCommand::*;
    Ok(match key {
        key::DECLARE_PUBLISHER => DeclarePublisher {
            correlation_id: reader.u32()?,
            publisher_id: reader.u8()?,
            reference: reader.text()?,
            stream: reader.text()?,
        },
        key::PUBLISH => Publish { publisher_id: reader.u8()?, messages: PublishedMessages::read(reader)? },
        key::QUERY_PUBLISHER_SEQUENCE => {
            QueryPublisherSequence { correlation_id: reader.u32()?, reference: reader.text()?, stream: reader.text()? }
        }
        key::DELETE_PUBLISHER => DeletePublisher { correlation_id: reader.u32()?, publisher_id: reader.u8()? },
        key::SUBSCRIBE => decode_subscribe(reader)?,
        key::CREDIT => Credit { subscription_id: reader.u8()?, credit: reader.u16()? },
        key::STORE_OFFSET => StoreOffset { reference: reader.text()?, stream: reader.text()?, offset: reader.u64()? },
        key::QUERY_OFFSET => QueryOffset { correlation_id: reader.u32()?, reference: reader.text()?, stream: reader.text()? },
        key::UNSUBSCRIBE => Unsubscribe { correlation_id: reader.u32()?, subscription_id: reader.u8()? },
        key::CREATE => Create { correlation_id: reader.u32()?, stream: reader.text()?, arguments: reader.text_map()? },
        key::DELETE => Delete { correlation_id: reader.u32()?, stream: reader.text()? },
        key::METADATA => Metadata { correlation_id: reader.u32()?, streams: reader.text_list()? },
        key::PEER_PROPERTIES => PeerProperties { correlation_id: reader.u32()?, properties: reader.text_map()? },
        key::SASL_HANDSHAKE => SaslHandshake { correlation_id: reader.u32()? },
        key::SASL_AUTHENTICATE => {
            SaslAuthenticate { correlation_id: reader.u32()?, mechanism: reader.text()?, response: reader.byte_string()? }
        }
        // RabbitMQ takes the client's tune with or without the response bit.
        key::TUNE | TUNE_RESPONSE => Tune { frame_max: reader.u32()?, heartbeat_s: reader.u32()? },
        key::OPEN => Open { correlation_id: reader.u32()?, virtual_host: reader.text()? },
        key::CLOSE => Close { correlation_id: reader.u32()?, code: reader.u16()?, reason: reader.text()? },
        CLOSE_RESPONSE => CloseResponse { correlation_id: reader.u32()?, code: reader.u16()? },
        key::HEARTBEAT => Heartbeat,
        key::ROUTE => Route { correlation_id: reader.u32()?, routing_key: reader.text()?, super_stream: reader.text()? },
        key::PARTITIONS => Partitions { correlation_id: reader.u32()?, super_stream: reader.text()? },
        other => return Err(DecodeError::UnknownCommand { key: other, version: VERSION_1 }),
    })
}

fn decode_subscribe(reader: &mut Reader) -> Result<ClientCommand, DecodeError> {
    let correlation_id = reader.u32()?;
    let subscription_id = reader.u8()?;
    let stream = reader.text()?;
    let offset = read_offset(reader)?;
    let credit = reader.u16()?;
    // The properties map is optional: absent (3.9 clients, or none to send) reads as empty.
    let properties = if reader.remaining() == 0 { TextMap::new() } else { reader.text_map()? };
    Ok(ClientCommand::Subscribe { correlation_id, subscription_id, stream, offset, credit, properties })
}
