//! The idempotency key a record keeps for its whole life (contract section 2.2).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The request header that carries a record's key; `www/sw.js` strips it (with the
/// expected-account header) from auth routes before the module loads.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// A validated `Idempotency-Key`: 1–255 visible ASCII characters (0x21–0x7E), the shape
/// Stripe and draft-ietf-httpapi-idempotency-key-header allow, so a page's own keys
/// (`order_1234`, an 80-character hash, `k:7f3e`) pass through as they are (contract
/// 2.2, r2). A minted key is a UUID v4 in its hyphenated form (36 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

/// Why a page-supplied key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key must be 1 to 255 characters long, got {0}")]
    Length(usize),
    #[error("Idempotency-Key may contain only visible ASCII characters (0x21-0x7E): no spaces, controls or non-ASCII")]
    Charset,
}

impl IdempotencyKey {
    pub const MIN_LEN: usize = 1;
    pub const MAX_LEN: usize = 255;

    /// Checks the shape of a key that came from a page, a record or a server.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        if !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(KeyError::Charset);
        }
        let len = s.len();
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&len) {
            return Err(KeyError::Length(len));
        }
        Ok(IdempotencyKey(s.to_owned()))
    }

    /// A UUID v4 built from 16 bytes of a cryptographic source. The caller supplies the
    /// bytes so this stays pure and testable; [`IdempotencyKey::mint`] uses `getrandom`.
    pub fn from_random_bytes(bytes: [u8; 16]) -> Self {
        let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
        IdempotencyKey(uuid.hyphenated().to_string())
    }

    /// A fresh key from the platform's cryptographic random source (Web Crypto in a
    /// browser). Fails only when that source does.
    pub fn mint() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(Self::from_random_bytes(bytes))
    }

    /// [`IdempotencyKey::mint`] for callers that only need to know whether it worked.
    pub fn mint_opt() -> Option<Self> {
        Self::mint().ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(s: String) -> Result<Self, KeyError> {
        IdempotencyKey::parse(&s)
    }
}

impl From<IdempotencyKey> for String {
    fn from(k: IdempotencyKey) -> String {
        k.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn minted_keys_are_uuid_v4_and_valid() {
        let a = IdempotencyKey::mint().expect("random source");
        let b = IdempotencyKey::mint().expect("random source");
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert_eq!(&a.as_str()[14..15], "4", "version nibble");
        assert!(
            matches!(&a.as_str()[19..20], "8" | "9" | "a" | "b"),
            "variant"
        );
        assert!(IdempotencyKey::parse(a.as_str()).is_ok());
    }

    #[test]
    fn real_page_keys_are_kept() {
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".repeat(2);
        for k in [
            "order_1234",
            &hash[..80],
            "k:7f3e",
            "a",
            "~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}",
        ] {
            assert_eq!(
                IdempotencyKey::parse(k).map(|k| k.0),
                Ok(k.to_owned()),
                "{k}"
            );
        }
        assert!(IdempotencyKey::parse(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn shape_is_enforced() {
        assert_eq!(IdempotencyKey::parse("").unwrap_err(), KeyError::Length(0));
        assert_eq!(
            IdempotencyKey::parse(&"a".repeat(256)).unwrap_err(),
            KeyError::Length(256)
        );
        for bad in [
            "has space",
            "tab\there",
            "new\nline",
            "caf\u{e9}",
            "\u{7f}del",
            "k\u{0}",
        ] {
            assert_eq!(
                IdempotencyKey::parse(bad).unwrap_err(),
                KeyError::Charset,
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn any_key_of_the_shape_round_trips(s in "[!-~]{1,255}") {
            let k = IdempotencyKey::parse(&s).expect("valid shape");
            let json = serde_json::to_string(&k).expect("serialises");
            let back: IdempotencyKey = serde_json::from_str(&json).expect("parses");
            prop_assert_eq!(back, k);
        }

        #[test]
        fn bytes_always_make_a_valid_key(b in any::<[u8; 16]>()) {
            let k = IdempotencyKey::from_random_bytes(b);
            prop_assert!(IdempotencyKey::parse(k.as_str()).is_ok());
        }
    }
}
