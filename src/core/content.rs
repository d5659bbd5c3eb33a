//! A record's body as a page sees it (`READ_RECORD`, `RECOVER_RECORD` edit): as text
//! when its Content-Type is textual and the bytes are UTF-8, else as base64. The
//! encoding is written here, small and exact, instead of pulling a crate into the module.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648 section 4).
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional); `None` on any other character.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    if text.len() - digits.len() > 2 || digits.len() % 4 == 1 {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|a| *a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

/// Whether a Content-Type names text a person can read and edit: `text/*`, JSON, XML,
/// form data, JavaScript (parameters such as `charset` aside).
pub fn is_textual(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind == "text"
        || (kind == "application"
            && (matches!(
                sub,
                "json" | "xml" | "x-www-form-urlencoded" | "javascript" | "ecmascript"
            ) || sub.ends_with("+json")
                || sub.ends_with("+xml")))
}

/// How a body travels in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEncoding {
    Text,
    Base64,
}

impl BodyEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyEncoding::Text => "text",
            BodyEncoding::Base64 => "base64",
        }
    }
}

/// A body for a page: text when textual and UTF-8, else base64.
pub fn present(bytes: &[u8], content_type: Option<&str>) -> (BodyEncoding, String) {
    if is_textual(content_type) {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return (BodyEncoding::Text, text.to_owned());
        }
    }
    (BodyEncoding::Base64, base64_encode(bytes))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), coded);
            assert_eq!(base64_decode(coded).as_deref(), Some(plain.as_bytes()));
        }
        assert_eq!(
            base64_decode("Zm9vYg").as_deref(),
            Some(&b"foob"[..]),
            "padding optional"
        );
        for bad in ["Z", "Zm9v!", "Zg===", "Z=g="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn textual_types_are_shown_as_text() {
        for ct in [
            "text/plain",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/problem+json",
            "application/atom+xml",
            "application/x-www-form-urlencoded",
        ] {
            assert!(is_textual(Some(ct)), "{ct}");
        }
        for ct in [
            None,
            Some("application/octet-stream"),
            Some("image/png"),
            Some("json"),
        ] {
            assert!(!is_textual(ct), "{ct:?}");
        }
        assert_eq!(
            present(br#"{"t":1}"#, Some("application/json")),
            (BodyEncoding::Text, r#"{"t":1}"#.to_owned())
        );
        assert_eq!(
            present(&[0xff, 0x00], Some("application/json")),
            (BodyEncoding::Base64, "/wA=".to_owned()),
            "not UTF-8: base64 whatever the type says"
        );
        assert_eq!(present(b"abc", None).0, BodyEncoding::Base64);
    }

    proptest! {
        #[test]
        fn base64_round_trips(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(base64_decode(&base64_encode(&bytes)), Some(bytes));
        }
    }
}
