//! The method structs and the [`Method`] enum, generated from the specification by `build.rs`.

use crate::reader::{write_long_str, write_short_str, write_table, Reader};
use crate::{DecodeError, FieldTable, LongStr, ShortStr};
use bytes::{BufMut, BytesMut};

include!(concat!(env!("OUT_DIR"), "/methods.rs"));
