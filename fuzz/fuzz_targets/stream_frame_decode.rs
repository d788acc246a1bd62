//! Feeds arbitrary bytes to the stream-protocol decoders, frame after frame, as a hostile peer
//! would: each frame as a client's command (what the 5552 server decodes) and as a server's
//! (what the perf client decodes), a publish's entries and a delivered chunk's entries walked to
//! the end.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stream_codec::{split_frame, Chunk, ClientCommand, ServerCommand};

fuzz_target!(|data: &[u8]| {
    let mut buffer = bytes::BytesMut::from(data);
    for _ in 0..1024 {
        let frame = match split_frame(&mut buffer, 1_048_576) {
            Ok(Some(frame)) => frame,
            Ok(None) | Err(_) => break,
        };
        if let Ok(ClientCommand::Publish { messages, .. }) = ClientCommand::decode(frame.clone()) {
            for published in messages.iter() {
                let _ = published.entry.records().map(|records| records.count());
            }
        }
        if let Ok(ServerCommand::Deliver { chunk, .. }) = ServerCommand::decode(frame) {
            if let Ok(chunk) = Chunk::parse(chunk) {
                for entry in chunk.entries().flatten() {
                    let _ = entry.records().map(|records| records.count());
                }
            }
        }
    }
});
