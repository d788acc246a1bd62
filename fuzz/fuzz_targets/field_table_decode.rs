//! Feeds arbitrary bytes to the field-table decoder (with and without its length prefix).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    let _ = amqp_codec::Reader::new(bytes.clone()).read_table();
    let _ = amqp_codec::Reader::new(bytes).read_table_entries(0);
});
