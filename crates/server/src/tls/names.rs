//! A client certificate's subject and issuer as RFC 4514 strings (`CN=client,O=Example`), the form
//! RabbitMQ's `peer_cert_subject` and `peer_cert_issuer` take. Only the few DER structures on the
//! way to the two names are read; anything unexpected gives None rather than a wrong name.

/// The subject and issuer of a DER certificate.
pub fn subject_and_issuer(certificate: &[u8]) -> Option<(String, String)> {
    let (_, certificate, _) = read(certificate, SEQUENCE)?;
    let (_, mut tbs, _) = read(certificate, SEQUENCE)?;
    // The version is an optional [0]; then serial, signature algorithm, issuer, validity, subject.
    if tbs.first() == Some(&VERSION) {
        tbs = read_any(tbs)?.2;
    }
    let (_, _, tbs) = read(tbs, INTEGER)?;
    let (_, _, tbs) = read(tbs, SEQUENCE)?;
    let (_, issuer, tbs) = read(tbs, SEQUENCE)?;
    let (_, _, tbs) = read(tbs, SEQUENCE)?;
    let (_, subject, _) = read(tbs, SEQUENCE)?;
    Some((format_name(subject)?, format_name(issuer)?))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OBJECT_IDENTIFIER: u8 = 0x06;
const VERSION: u8 = 0xA0;

/// One DER element with the expected tag: (tag, contents, what follows).
fn read(input: &[u8], tag: u8) -> Option<(u8, &[u8], &[u8])> {
    read_any(input).filter(|(found, _, _)| *found == tag)
}

/// One DER element, whatever its tag (single-byte tags only, as in certificates' names).
fn read_any(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first_length_byte = *input.get(1)?;
    let (length, header_bytes) = if first_length_byte < 0x80 {
        (usize::from(first_length_byte), 2)
    } else {
        let length_bytes = usize::from(first_length_byte & 0x7F);
        if length_bytes == 0 || length_bytes > 4 {
            return None;
        }
        let length = input.get(2..2 + length_bytes)?.iter().fold(0usize, |length, byte| (length << 8) | usize::from(*byte));
        (length, 2 + length_bytes)
    };
    let contents = input.get(header_bytes..header_bytes.checked_add(length)?)?;
    Some((tag, contents, &input[header_bytes + length..]))
}

/// A Name (a sequence of relative distinguished names) in RFC 4514 order: the last one first.
fn format_name(mut name: &[u8]) -> Option<String> {
    let mut relative_names = Vec::new();
    while !name.is_empty() {
        let (_, mut set, rest) = read(name, SET)?;
        name = rest;
        let mut attributes = Vec::new();
        while !set.is_empty() {
            let (_, attribute, rest) = read(set, SEQUENCE)?;
            set = rest;
            let (_, oid, value) = read(attribute, OBJECT_IDENTIFIER)?;
            let (value_tag, value_contents, after_value) = read_any(value)?;
            let value_element = &value[..value.len() - after_value.len()];
            attributes.push(format!("{}={}", attribute_name(oid)?, format_value(value_tag, value_contents, value_element)));
        }
        relative_names.push(attributes.join("+"));
    }
    relative_names.reverse();
    Some(relative_names.join(","))
}

/// The short names RFC 4514 and OpenSSL use; other attributes by their dotted OID.
fn attribute_name(oid: &[u8]) -> Option<String> {
    let dotted = dotted_oid(oid)?;
    let short = match dotted.as_str() {
        "2.5.4.3" => "CN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "STREET",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "1.2.840.113549.1.9.1" => "emailAddress",
        _ => return Some(dotted),
    };
    Some(short.to_string())
}

fn dotted_oid(oid: &[u8]) -> Option<String> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut arc = 0u64;
    for byte in oid {
        arc = arc.checked_mul(128)? | u64::from(byte & 0x7F);
        if byte & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (arc / 40).min(2);
                arcs.push(first);
                arcs.push(arc - first * 40);
            } else {
                arcs.push(arc);
            }
            arc = 0;
        }
    }
    if arcs.is_empty() {
        return None;
    }
    Some(arcs.iter().map(u64::to_string).collect::<Vec<_>>().join("."))
}

/// A string value, escaped as RFC 4514 asks; a value of another type as `#` and its DER in hex.
fn format_value(tag: u8, contents: &[u8], element: &[u8]) -> String {
    const UTF8_STRING: u8 = 0x0C;
    const PRINTABLE_STRING: u8 = 0x13;
    const TELETEX_STRING: u8 = 0x14;
    const IA5_STRING: u8 = 0x16;
    const BMP_STRING: u8 = 0x1E;
    let text = match tag {
        UTF8_STRING | PRINTABLE_STRING | TELETEX_STRING | IA5_STRING => String::from_utf8_lossy(contents).into_owned(),
        BMP_STRING => {
            let units: Vec<u16> = contents.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]])).collect();
            String::from_utf16_lossy(&units)
        }
        _ => {
            return format!("#{}", element.iter().map(|byte| format!("{byte:02x}")).collect::<String>());
        }
    };
    let mut escaped = String::with_capacity(text.len());
    let last = text.chars().count().saturating_sub(1);
    for (index, character) in text.chars().enumerate() {
        let special = matches!(character, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (index == 0 && matches!(character, '#' | ' '))
            || (index == last && character == ' ');
        if special {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    /// Self-signed, made with `openssl req -x509 -subj "/C=NL/O=Lepus, Inc./OU=tests/CN=lepus-client"`;
    /// `openssl x509 -noout -subject -nameopt RFC2253` prints the expected name.
    const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----
MIIB6zCCAZGgAwIBAgIUVBUKcUG3vuHGsWlWPDj0mL7T1zYwCgYIKoZIzj0EAwIw
SjELMAkGA1UEBhMCTkwxFDASBgNVBAoMC0xlcHVzLCBJbmMuMQ4wDAYDVQQLDAV0
ZXN0czEVMBMGA1UEAwwMbGVwdXMtY2xpZW50MCAXDTI2MTEyMjA4MzAzMFoYDzIx
MjYxMDI5MDgzMDMwWjBKMQswCQYDVQQGEwJOTDEUMBIGA1UECgwLTGVwdXMsIElu
Yy4xDjAMBgNVBAsMBXRlc3RzMRUwEwYDVQQDDAxsZXB1cy1jbGllbnQwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAARH45Q3d48NjIzQguQO79yXcmic9ni/CakZ9D8L
fJlxBDKukrwHtZlXA1xOJ1MnBIB/7AmVkImsS574A1KLoof8o1MwUTAdBgNVHQ4E
FgQUeSqFbkX9YY16Bd7E4BUCK4WyTBYwHwYDVR0jBBgwFoAUeSqFbkX9YY16Bd7E
4BUCK4WyTBYwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAwGYu
6E+eMskpPp7C+CRijEAjgJ2bpfmn74T9WeTYiWwCIEEgeZLyx4sKS9ws3ZKNy19r
7S64FUux2DBZTvjN/rAe
-----END CERTIFICATE-----
";

    #[test]
    fn names_read_as_rfc_4514() {
        let certificate = CertificateDer::from_pem_slice(CERTIFICATE.as_bytes()).expect("a PEM certificate");
        let (subject, issuer) = subject_and_issuer(&certificate).expect("names");
        assert_eq!(subject, "CN=lepus-client,OU=tests,O=Lepus\\, Inc.,C=NL");
        assert_eq!(issuer, subject, "self-signed");
    }

    #[test]
    fn truncated_or_foreign_input_gives_none_without_panicking() {
        let certificate = CertificateDer::from_pem_slice(CERTIFICATE.as_bytes()).expect("a PEM certificate");
        for length in 0..certificate.len() {
            let _ = subject_and_issuer(&certificate[..length]);
        }
        assert_eq!(subject_and_issuer(b"\x30\x84\xff\xff\xff\xff"), None);
        assert_eq!(subject_and_issuer(b"not DER at all"), None);
    }

    #[test]
    fn oids_and_values_format() {
        assert_eq!(dotted_oid(&[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x09, 0x01]).as_deref(), Some("1.2.840.113549.1.9.1"));
        assert_eq!(format_value(0x0C, b" #lead, trail ", b""), "\\ #lead\\, trail\\ ");
        assert_eq!(format_value(0x02, b"\x07", b"\x02\x01\x07"), "#020107");
    }
}
