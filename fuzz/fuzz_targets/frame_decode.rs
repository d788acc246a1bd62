//! Feeds arbitrary bytes to the frame decoder, frame after frame, as a hostile client would.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buffer = bytes::BytesMut::from(data);
    for _ in 0..1024 {
        match amqp_codec::decode_frame(&mut buffer, 131_072) {
            Ok(Some(amqp_codec::Frame { payload: amqp_codec::FramePayload::Header(header), .. })) => {
                let _ = header.properties();
                let _ = header.delivery_mode();
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
});
